"""Helpers of the `seqpack bench` command tests (the app with its plugins, one-line errors, work recorders)."""

from __future__ import annotations


def _cli():
    from seqpack.cli.app import app  # `bench` comes from the seqpack.cli entry points

    return app


def _one_line_error(r) -> str:
    """The single ``error: ...`` line of a failed command (no traceback)."""
    assert "Traceback" not in r.output, r.output
    errors = [ln for ln in r.output.splitlines() if ln.startswith("error: ")]
    assert len(errors) == 1, r.output
    return errors[0]


def _forbid(monkeypatch, module: str, name: str) -> list:
    """Replace ``module.name`` by a recorder: a command that reaches it did work before failing."""
    import importlib

    calls = []
    monkeypatch.setattr(importlib.import_module(module), name, lambda *a, **k: calls.append((a, k)) or {})
    return calls
