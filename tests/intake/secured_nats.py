"""A nats-server started from deploy/nats (accounts, users, permissions), with fresh passwords for every user."""

from __future__ import annotations

import os
import secrets
import subprocess
from pathlib import Path

from oneplus.devstack import find_nats_server, free_port, spawn, stop, wait_port

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "nats"
CONFIG = DEPLOY / "nats-server.conf"
USERS = {
    "admin": "NATS_ADMIN_PASSWORD",
    "intake": "NATS_INTAKE_PASSWORD",
    "topology-registry": "NATS_TOPOLOGY_REGISTRY_PASSWORD",
    "placement-solver": "NATS_PLACEMENT_SOLVER_PASSWORD",
    "preemption": "NATS_PREEMPTION_PASSWORD",
    "executor-h100-0": "NATS_EXECUTOR_H100_0_PASSWORD",
    "executor-h100-1": "NATS_EXECUTOR_H100_1_PASSWORD",
    "nlp-ci": "NATS_NLP_CI_PASSWORD",
    "nlp-alice": "NATS_NLP_ALICE_PASSWORD",
    "vision-ci": "NATS_VISION_CI_PASSWORD",
}


class SecuredNats:
    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.port = free_port()
        # nats-server parses an environment value as a config token: start it with a letter, keep it alphanumeric
        self.passwords = {user: "pw" + secrets.token_hex(12) for user in USERS}
        self.proc: subprocess.Popen[bytes] | None = None

    def env(self) -> dict[str, str]:
        passwords = {USERS[u]: p for u, p in self.passwords.items()}
        return {**os.environ, **passwords, "NATS_STORE_DIR": str(self.workdir / "js")}

    def url(self, user: str) -> str:
        return f"nats://{user}:{self.passwords[user]}@127.0.0.1:{self.port}"

    def start(self) -> SecuredNats:
        argv = [find_nats_server(), "-c", str(CONFIG), "-a", "127.0.0.1", "-p", str(self.port)]
        argv += ["-m", str(free_port())]
        self.proc = spawn(argv, self.workdir / "nats-server.log", self.env())
        wait_port(self.port, proc=self.proc)
        return self

    def stop(self) -> None:
        if self.proc is not None:
            stop([self.proc])
