"""The services layer: Jupyter Server and sshd, judged by their protocols; one module per probe."""
