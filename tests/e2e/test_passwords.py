"""Password changes over real sockets: SET LOGIN PASSWORD SCRAM-SHA-256 (neither password on the
wire), then logins with the new password by SCRAM and by CLEAR, through the library and `smqp passwd`."""

from __future__ import annotations

import asyncio

import pytest

from gateway.client import cli
from gateway.accounts import hash_password
from gateway.client import SMQPClient, SMQPError
from gateway.replies import UNAUTHORIZED
from tests.e2e.stack import GatewayThread, stack_config

pytestmark = pytest.mark.e2e

SCRAM = "SCRAM-SHA-256"


async def login_fails(address, account: str, password: str, method: str) -> int:
    async with await SMQPClient.connect(*address) as client:
        with pytest.raises(SMQPError) as refused:
            await client.login(account, password, method=method)
        return refused.value.code


def test_a_password_changed_by_scram_logs_in_by_scram_and_by_clear(broker, tmp_path, monkeypatch):
    config = stack_config(broker, tmp_path, {"ann": hash_password("0ld-secret", iterations=4096)})
    with GatewayThread(config) as gateway:
        address = gateway.address

        async def change_by_library():
            async with await SMQPClient.open(*address, "ann", "0ld-secret", method=SCRAM) as client:
                with pytest.raises(SMQPError) as refused:  # a wrong old password is refused, nothing changes
                    await client.change_password("not-it", "n3w-secret", method=SCRAM)
                assert refused.value.code == UNAUTHORIZED
                await client.change_password("0ld-secret", "n3w-secret", method=SCRAM)
                await client.noop()  # the connection goes on after the exchange
            for method in (SCRAM, "CLEAR"):
                async with await SMQPClient.open(*address, "ann", "n3w-secret", method=method) as client:
                    assert client.login_attributes["Topic"] == "/accounts/ann"
                assert await login_fails(address, "ann", "0ld-secret", method) == UNAUTHORIZED
        asyncio.run(change_by_library())

        answers = iter(["th1rd-secret", "th1rd-secret"])  # the new password, twice
        monkeypatch.setattr(cli.getpass, "getpass", lambda prompt="": next(answers))
        host, port = address
        assert cli.main(["--host", host, "--port", str(port), "--user", "ann", "--password", "n3w-secret",
                         "--auth", "scram-sha-256", "passwd"]) == 0

        async def log_in_with_the_third():
            for method in ("CLEAR", SCRAM):
                async with await SMQPClient.open(*address, "ann", "th1rd-secret", method=method):
                    pass
            assert await login_fails(address, "ann", "n3w-secret", "CLEAR") == UNAUTHORIZED
        asyncio.run(log_in_with_the_third())
