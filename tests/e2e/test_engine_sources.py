"""Where engine.sh takes the newer Docker engine from: the Debian mirror that this machine's own
apt sources already use (debian-mirror.sh), so no package host is written in the repository.

No engine needed: the script reads apt source files from a directory the test writes.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

HERE = Path(__file__).resolve().parent
SCRIPT = HERE / "debian-mirror.sh"

DEB822 = """\
Types: deb
# http://snapshot.example/archive/debian-security/20250520T000000Z
URIs: http://mirror.example/debian-security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://disabled.example/debian
Suites: bookworm
Components: main
Enabled: no

Types: deb-src deb
URIs: cdrom:/media/
 https://mirror.example/debian/
Suites: bookworm bookworm-updates
Components: main
"""


def mirror(tmp_path: Path, files: dict[str, str], codename: str = "bookworm"
           ) -> subprocess.CompletedProcess[str]:
    etc = tmp_path / "apt"
    (etc / "sources.list.d").mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (etc / name).write_text(text)
    os_release = tmp_path / "os-release"
    os_release.write_text(f'PRETTY_NAME="Debian GNU/Linux"\nVERSION_CODENAME={codename}\nID=debian\n')
    return subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, timeout=30, check=False,
                          env={"PATH": "/usr/bin:/bin", "E2E_APT_ETC": str(etc),
                               "E2E_OS_RELEASE": str(os_release)})


def test_deb822_skips_security_disabled_and_non_http_entries(tmp_path: Path) -> None:
    res = mirror(tmp_path, {"sources.list.d/debian.sources": DEB822,
                            "sources.list.d/other.sources.disabled": "Types: deb\nURIs: http://x.example/\n"
                                                                     "Suites: bookworm\n"})
    assert (res.returncode, res.stdout, res.stderr) == (0, "https://mirror.example/debian\n", "")


def test_one_line_form_with_options_and_apts_order(tmp_path: Path) -> None:
    files = {
        "sources.list": "# deb http://commented.example/debian bookworm main\n"
                        "deb [arch=amd64 signed-by=/k.gpg] http://security.example/debian-security "
                        "bookworm-security main\n",
        # By name, a.list comes before b.sources: apt's order, whatever the extension.
        "sources.list.d/a.list": "deb-src http://src.example/debian bookworm main\n"
                                 "deb [ signed-by=/k.gpg ] http://first.example/debian/ bookworm main contrib\n",
        "sources.list.d/b.sources": DEB822,
    }
    res = mirror(tmp_path, files)
    assert (res.returncode, res.stdout) == (0, "http://first.example/debian\n"), res.stderr
    files["sources.list"] += "deb http://main.example/debian bookworm main\n"
    assert mirror(tmp_path, files).stdout == "http://main.example/debian\n", "sources.list comes first"


def test_no_source_for_this_release_is_an_error_with_the_override(tmp_path: Path) -> None:
    res = mirror(tmp_path, {"sources.list.d/debian.sources": DEB822}, codename="trixie")
    assert res.returncode == 1 and res.stdout == ""
    assert "no enabled deb source for trixie" in res.stderr and "E2E_TRIXIE_MIRROR" in res.stderr


def test_the_readme_recipe_is_the_adopt_images_lines():
    """docs/image.md's "Add it to your own image" block and tests/e2e/adopt/Dockerfile cannot drift."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    dockerfile = (root / "tests/e2e/adopt/Dockerfile").read_text()
    lines = dockerfile.split("# --- docs/image.md: add it to your own image ---\n", 1)[1].split("# --- end ---", 1)[0]
    readme = (root / "docs/image.md").read_text()
    section = readme.split("## Add it to your own image", 1)[1].split("\n## ", 1)[0]
    block = section.split("```dockerfile\n", 1)[1].split("```", 1)[0]
    assert lines.strip() in block
