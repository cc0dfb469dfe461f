"""The services layer: Jupyter Server and sshd, judged by their protocols; one module per probe
(jupyter, jupyter_kernel, ssh, ssh_keys, ssh_login), each declaring its ``SPEC`` beside its
``gather`` and ``judge``."""
