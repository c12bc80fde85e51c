"""How one side of a connection proves it knows a secret of the attempt, without sending it.

The accepting side sends `NONCE_BYTES` fresh random bytes; the connecting side answers with
`proof`: the HMAC-SHA256 of the nonce under the secret, with a label of what the connection
is for, so an answer for one door is no answer for another. Two doors use it: the rank
tunnel between the workers of a job over several hosts (`worker.trainer.tunnel`, label
`rank`), and a notebook session's door, which only the API passes (`worker.notebook`,
label `session`).
"""

from __future__ import annotations

import hashlib
import hmac

NONCE_BYTES = 32
PROOF_BYTES = hashlib.sha256().digest_size
AUTH_TIMEOUT_S = 5.0
"""How long the accepting side waits for the answer before it closes the connection."""


def proof(key: str, nonce: bytes, label: str) -> bytes:
    """The answer to `nonce` of one who knows `key` (hex), for connections of kind `label`."""
    return hmac.new(bytes.fromhex(key), f"towerq-{label}:".encode() + nonce, hashlib.sha256).digest()


def proven(key: str, nonce: bytes, label: str, answer: bytes) -> bool:
    return hmac.compare_digest(answer, proof(key, nonce, label))
