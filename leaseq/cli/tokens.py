"""The HTTP API's tokens: ``leaseq tokens create NAME --scope S --queue Q`` (prints the
token once, as its last line), ``leaseq tokens revoke NAME`` and ``leaseq tokens list``,
over ``Client.create_token`` / ``revoke_token`` / ``tokens`` (docs/http-api.md)."""

from __future__ import annotations

import click

from leaseq.cli.render import emit_json, table
from leaseq.cli.settings import Settings, actor_option, pass_settings
from leaseq.rules.tokens import SCOPES


@click.group()
def tokens() -> None:
    """Bearer tokens of the HTTP API (leaseq web's /api/v1/)."""


@tokens.command("create")
@click.argument("name")
@click.option(
    "--scope",
    "scopes",
    multiple=True,
    required=True,
    type=click.Choice(SCOPES),
    help="What the token may do (repeatable).",
)
@click.option(
    "--queue", "queues", multiple=True, help="A queue it may act on (repeatable; default: all)."
)
@actor_option("created it")
@pass_settings
def tokens_create(
    settings: Settings, name: str, scopes: tuple[str, ...], queues: tuple[str, ...], actor: str
) -> None:
    """Make a token; it is printed once, as the last line, and only its hash is kept."""
    token = settings.client.create_token(
        name, scopes=list(scopes), queues=list(queues) or None, actor=actor
    )
    where = ", ".join(queues) if queues else "every queue"
    click.echo(f"token {name} created by {actor}: {', '.join(scopes)} on {where}")
    click.echo("it is shown only now; store it as a secret:")
    click.echo(token)


@tokens.command("revoke")
@click.argument("name")
@pass_settings
def tokens_revoke(settings: Settings, name: str) -> None:
    """Revoke the token NAME at once (its name is not reused)."""
    if settings.client.revoke_token(name):
        click.echo(f"token {name} revoked")
    else:
        click.echo(f"there is no live token {name}")


@tokens.command("list")
@click.option("--json", "as_json", is_flag=True)
@pass_settings
def tokens_list(settings: Settings, as_json: bool) -> None:
    """Every token (never its secret): scopes, queues, who made it, revoked or live."""
    found = settings.client.tokens()
    if as_json:
        emit_json(found)
        return
    rows = [
        [
            t["name"],
            ",".join(t["scopes"]),
            ",".join(t["queues"] or ["*"]),
            t["created_by"] or "-",
            "revoked" if t["revoked_at"] else "live",
        ]
        for t in found
    ]
    click.echo(table(["token", "scopes", "queues", "by", ""], rows) if rows else "no tokens")


COMMANDS: tuple[click.Command, ...] = (tokens,)
