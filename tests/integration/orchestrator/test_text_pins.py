"""The orchestrator's text identity uses the same hashes the artifact manifests record."""

from __future__ import annotations

from libs.text.context import TextContext, TextPins
from services.artifact_builder.snapshot import inspect_checkpoint


def test_text_identity_matches_the_checkpoint_snapshot(checkpoint):
    snapshot = inspect_checkpoint(checkpoint).snapshot
    pins = TextPins(tokenizer_sha256=snapshot.tokenizer_sha256,
                    template_sha256=snapshot.chat_template_sha256)
    assert TextContext.from_checkpoint(checkpoint, pins).identity.tokenizer_sha256 == \
        snapshot.tokenizer_sha256
