"""The encryption-key commands (docs/encryption.md), in the ``leaseq keys`` group beside the
ordering keys' ones: ``keys generate`` prints a new key; ``keys rotate`` re-seals every
stored value under the newest of ``LEASEQ_ENCRYPTION_KEYS``, in bounded batches, with
progress, resumable after a crash; ``--dry-run`` counts what is left."""

from __future__ import annotations

import click

from leaseq.cli.render import emit_json
from leaseq.cli.settings import Settings, pass_settings
from leaseq.client import Client
from leaseq.codec import KEYS_ENV, Encryption, Keyring, generate_key
from leaseq.errors import ConfigError


@click.command("generate")
def keys_generate() -> None:
    """Print a new random encryption key (put it first in LEASEQ_ENCRYPTION_KEYS)."""
    click.echo(generate_key())


def _rotation_client(settings: Settings, app_ref: str | None) -> Client:
    if app_ref is not None:
        from leaseq.cli.worker import bind_app, load_app

        app = load_app(app_ref)
        bind_app(app, settings)
        if app.keyring is None:
            raise ConfigError(f"{app_ref} has no encryption keys ({KEYS_ENV})")
        return Client(app.dsn, **{**app.client_options(), "pool_size": 2})
    keyring = Keyring.from_env()
    if keyring is None:
        raise ConfigError(f"set {KEYS_ENV} to the keys, newest first, or give --app")
    return Client(
        settings.dsn,
        schema=settings.schema,
        pool_size=2,
        prepare=settings.prepare,
        encryption=Encryption(keyring, tasks=frozenset()),
    )


@click.command("rotate")
@click.option(
    "--app",
    "app_ref",
    default=None,
    metavar="MODULE:APP",
    help="Take the keys and the payload store from this app (needed for payloads in S3).",
)
@click.option("--batch", type=click.IntRange(1, 10_000), default=500, show_default=True)
@click.option("--dry-run", is_flag=True, help="Only count the values sealed under older keys.")
@click.option("--json", "as_json", is_flag=True)
@pass_settings
def keys_rotate(
    settings: Settings, app_ref: str | None, batch: int, dry_run: bool, as_json: bool
) -> None:
    """Re-encrypt stored payloads, results, effect and step records under the newest key.

    Safe beside running workers, and resumable: run it again after an interruption. Keep
    the old keys in LEASEQ_ENCRYPTION_KEYS (after the new one) until it reports 0 left.
    """
    client = _rotation_client(settings, app_ref)
    try:
        if dry_run:
            left = client.sealed_left()
            if as_json:
                emit_json({"left": left})
            else:
                click.echo("left: " + ", ".join(f"{k} {v}" for k, v in left.items()))
            return

        def progress(step: object) -> None:
            rotated = getattr(step, "rotated", {})
            if not as_json:
                line = ", ".join(f"{k} {v}" for k, v in rotated.items())
                click.echo(f"rotated: {line}", err=True)

        done = client.rotate_keys(batch=batch, progress=progress)
    finally:
        client.close()
    if as_json:
        emit_json({"rotated": done.rotated, "left": done.left})
    else:
        click.echo(
            f"rotated {sum(done.rotated.values())} value(s); left: {sum(done.left.values())}"
        )


KEY_COMMANDS: tuple[click.Command, ...] = (keys_generate, keys_rotate)
