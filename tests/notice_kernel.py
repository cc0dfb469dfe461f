"""A person's cells in a new kernel, through a Jupyter Server: start a kernel (REST), run each cell
over its channels (websocket, messaging protocol v5) and collect its stdout and stderr, delete the
kernel. Stdlib and websocket-client only: the end-to-end tests run this file inside the container
with the suite's interpreter (``python - URL TOKEN KERNEL CELLS-JSON``, printing the JSON result).

Each cell is ``[code, store_history]``: a person's cell keeps its history, the health check's
(and a kernel's start lines) do not.
"""

from __future__ import annotations

import json
import sys
import urllib.request
import uuid

import websocket


def api(base: str, token: str, method: str, path: str, body: object = None, timeout: float = 60) -> object:
    req = urllib.request.Request(base + path, method=method,
                                 data=None if body is None else json.dumps(body).encode(),
                                 headers={"Authorization": f"token {token}"})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(req, timeout=timeout) as resp:
        text = resp.read()
    return json.loads(text) if text else None


def execute(ws: websocket.WebSocket, session: str, code: str, store_history: bool) -> dict[str, str]:
    msg_id = uuid.uuid4().hex
    ws.send(json.dumps({
        "header": {"msg_id": msg_id, "username": "person", "session": session, "date": "",
                   "msg_type": "execute_request", "version": "5.3"},
        "parent_header": {}, "metadata": {}, "channel": "shell", "buffers": [],
        "content": {"code": code, "silent": False, "store_history": store_history, "user_expressions": {},
                    "allow_stdin": False, "stop_on_error": True}}))
    got = {"stdout": "", "stderr": "", "error": ""}
    idle = replied = False
    while not (idle and replied):
        frame = ws.recv()
        if not isinstance(frame, str):
            continue
        msg = json.loads(frame)
        if msg.get("parent_header", {}).get("msg_id") != msg_id:
            continue
        kind, content = msg["header"]["msg_type"], msg["content"]
        if kind == "stream":
            got[content["name"]] += content["text"]
        elif kind == "error":
            got["error"] = f"{content['ename']}: {content['evalue']}"
        elif kind == "status" and content["execution_state"] == "idle":
            idle = True
        elif kind == "execute_reply":
            replied = True
    return got


def run_cells(base: str, token: str, kernel: str, cells: list[tuple[str, bool]],
              timeout: float = 60) -> list[dict[str, str]]:
    """Each cell's ``stdout``, ``stderr`` and ``error``, in a new kernel of ``kernel`` ("": the
    server's default), which is deleted."""
    started = api(base, token, "POST", "api/kernels", {"name": kernel} if kernel else {})
    assert isinstance(started, dict)
    kid = started["id"]
    try:
        ws = websocket.create_connection(f"ws{base[4:]}api/kernels/{kid}/channels", timeout=timeout,
                                         header=[f"Authorization: token {token}"], suppress_origin=True,
                                         http_no_proxy=["*"])
        try:
            session = uuid.uuid4().hex
            return [execute(ws, session, code, keep) for code, keep in cells]
        finally:
            ws.close()
    finally:
        api(base, token, "DELETE", f"api/kernels/{kid}")


if __name__ == "__main__":
    url, token_text, name, cells_json = sys.argv[1:5]
    print(json.dumps(run_cells(url, token_text, name, [(c, bool(k)) for c, k in json.loads(cells_json)])))
