"""``leaseq web``: serve the dashboard (``leaseq.web``) with uvicorn. Without credentials it
serves on loopback only; a non-loopback ``--host`` then is refused in one line, and so is a
password shorter than 12 characters. Requests must name the bound address (or, on loopback,
a loopback name) or an ``--allowed-host`` in their ``Host`` header: DNS rebinding is refused.
"""

from __future__ import annotations

import ipaddress
import os
import pathlib

import click

from leaseq.cli.settings import Settings, pass_settings
from leaseq.errors import ConfigError

MISSING_EXTRA = "the dashboard needs the web extra: pip install 'leaseq[web]'"
#: The shortest password `leaseq web` accepts when it serves beyond loopback.
MIN_PASSWORD_BEYOND_LOOPBACK = 12


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def allowed_host_list(host: str, extra: tuple[str, ...]) -> list[str]:
    """The Host allow-list: the bound address (a wildcard one admits any IP literal), the
    loopback names when bound to loopback, and each ``--allowed-host``."""
    from leaseq.web.security import LOOPBACK_NAMES, HostPolicy  # the web extra's

    hosts = [host, *extra]
    if is_loopback(host):
        hosts += LOOPBACK_NAMES
    try:
        HostPolicy(hosts)
    except ValueError as exc:
        raise ConfigError(f"--allowed-host: {exc}") from None
    return hosts


def credentials(user: str | None, password_file: str | None) -> tuple[str, str] | None:
    """The basic auth user and password: --user with --password-file, else
    LEASEQ_WEB_USER with LEASEQ_WEB_PASSWORD; None when neither is configured."""
    if user is not None or password_file is not None:
        if user is None or password_file is None:
            raise ConfigError("--user and --password-file go together")
        try:
            password = pathlib.Path(password_file).read_text(encoding="utf-8").strip("\r\n")
        except OSError as exc:
            raise ConfigError(f"cannot read --password-file: {exc.strerror or exc}") from None
        except UnicodeError:
            raise ConfigError("--password-file is not UTF-8 text") from None
    else:
        user = os.environ.get("LEASEQ_WEB_USER") or None
        password = os.environ.get("LEASEQ_WEB_PASSWORD") or ""
        if user is None and not password:
            return None
        if user is None or not password:
            raise ConfigError("set both LEASEQ_WEB_USER and LEASEQ_WEB_PASSWORD, or neither")
    if not password:
        raise ConfigError("the dashboard password is empty")
    if not user or ":" in user:
        raise ConfigError("the dashboard user must be non-empty and without ':'")
    return user, password


@click.command("web")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option(
    "--port", type=click.IntRange(0, 65535), default=8080, show_default=True, help="Port."
)
@click.option("--user", help="Basic auth user (or LEASEQ_WEB_USER).")
@click.option(
    "--password-file",
    type=click.Path(dir_okay=False),
    help="File holding the basic auth password (or LEASEQ_WEB_PASSWORD).",
)
@click.option("--read-only", is_flag=True, help="Show everything, offer and accept no action.")
@click.option(
    "--api-only",
    is_flag=True,
    help="Serve only the HTTP API (/api/v1/, bearer tokens), not the dashboard.",
)
@click.option("--base-path", default="", help="Prefix a reverse proxy serves the dashboard under.")
@click.option(
    "--allowed-host",
    "allowed_hosts",
    multiple=True,
    help="A host name requests may use besides the bound address (repeatable).",
)
@click.option(
    "--trust-forwarded",
    is_flag=True,
    help="Trust X-Forwarded-Proto/-For from the reverse proxy (Secure cookies over its TLS).",
)
@click.option(
    "--timeout",
    type=click.FloatRange(0.1, 300.0),
    default=5.0,
    show_default=True,
    help="Statement timeout of every dashboard query, in seconds.",
)
@pass_settings
def web(
    settings: Settings,
    host: str,
    port: int,
    user: str | None,
    password_file: str | None,
    read_only: bool,
    api_only: bool,
    base_path: str,
    allowed_hosts: tuple[str, ...],
    trust_forwarded: bool,
    timeout: float,
) -> None:
    """Serve the web dashboard (queues, jobs, dead jobs, replay, pauses) and the HTTP API
    under /api/v1/ (bearer tokens from `leaseq tokens create`)."""
    login = credentials(user, password_file)
    if login is None and not is_loopback(host) and not api_only:
        raise ConfigError(
            f"refusing to serve the dashboard on {host} without authentication: set "
            "LEASEQ_WEB_USER and LEASEQ_WEB_PASSWORD (or --user and --password-file), "
            "or keep --host 127.0.0.1"
        )
    short = login is not None and len(login[1]) < MIN_PASSWORD_BEYOND_LOOPBACK
    if short and not is_loopback(host):
        raise ConfigError(
            f"the dashboard password must be at least {MIN_PASSWORD_BEYOND_LOOPBACK} "
            f"characters when serving on {host} (beyond loopback)"
        )
    try:
        # The extra's packages are optional: imported only by this command.
        import uvicorn

        from leaseq.client_async import AsyncClient
        from leaseq.web import BasicAuth, create_app
        from leaseq.web.api import create_api, with_api
        from leaseq.web.security import check_base_path, secret_from_env
    except ImportError:
        raise ConfigError(MISSING_EXTRA) from None
    hosts = allowed_host_list(host, allowed_hosts)
    try:
        base_path = check_base_path(base_path)
        secret = secret_from_env()
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    settings.client.check_schema()  # a wrong DSN or schema fails here, in one line
    settings.reader.read_replica_lag()  # and so does an unreachable --read-dsn
    client = AsyncClient(
        settings.dsn,
        schema=settings.schema,
        prepare=settings.prepare,
        read_dsn=settings.read_dsn,
    )
    client.web_timeout_ms = int(timeout * 1000)
    api = create_api(client, allowed_hosts=hosts, trust_forwarded=trust_forwarded)
    if api_only:
        click.echo(f"leaseq web: http://{host}:{port}/api/v1/ (the HTTP API only)", err=True)
        uvicorn.run(
            with_api(None, api), host=host, port=port, log_level="warning", proxy_headers=False
        )
        return
    dashboard = create_app(
        client,
        auth=BasicAuth(*login) if login else None,
        read_only=read_only,
        base_path=base_path,
        close_client=True,
        allowed_hosts=hosts,
        trust_forwarded=trust_forwarded,
        csrf_secret=secret,
    )
    mode = " (read-only)" if read_only else ""
    who = f", basic auth user {login[0]}" if login else ", no auth: loopback only"
    click.echo(f"leaseq web: http://{host}:{port}{base_path}/{mode}{who}", err=True)
    app = with_api(dashboard, api, close_client=client)
    uvicorn.run(app, host=host, port=port, log_level="warning", proxy_headers=False)
