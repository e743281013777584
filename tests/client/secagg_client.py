"""A secure-aggregation client for `/secagg/rounds`, written from docs/SECAGG.md alone (with
src/ops/mpc/secagg/protocol.rs consulted only where the page left a doubt): a second,
independent implementation of every derivation, so that the server and the reference
client (Rust) cannot agree on a mistake they share.

Two layers:

- the protocol's pieces as plain functions (keys, HKDF, share messages, Shamir over BN254's
  scalar field, masks, the SecAgg+ neighbourhood graph, quantisation), which need only the
  `cryptography` package;
- `SecAggClient`, one participant: it builds each request body from the round as the server
  shows it and checks each answer, and `SecAggClient.*_via` / `Coordinator` make the calls
  through the generated `gpu_ops_client` package (openapi-python-client).

The round-trip tests (test_roundtrip.py) call the generated operations themselves and use
this module for the cryptography; `run_round` drives a whole round for other tests.
"""

from __future__ import annotations

import base64
import hashlib
import os
import struct
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Iterable, Sequence

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

# BN254's scalar field: the secrets σ and β and their shares live here.
R = 21888242871839275222246405745257275088548364400416034343698204186575808495617
LABEL = b"gpu-ops/secagg/v1/"
SHARE_PLAINTEXT_BYTES = 4 + 4 + 32 + 32
SHARE_CIPHERTEXT_BYTES = SHARE_PLAINTEXT_BYTES + 16
ZERO_NONCE = bytes(12)
RING = 1 << 32


class ProtocolError(Exception):
    """Something the server showed or sent does not fit the protocol: the client stops."""


# ---------------------------------------------------------------------------------------
# Encodings.


def b64(data: bytes) -> str:
    """Standard base64 with padding (RFC 4648 §4)."""
    return base64.b64encode(data).decode("ascii")


def unb64(text: str) -> bytes:
    return base64.b64decode(text.encode("ascii"), validate=True)


def be32(x: int) -> bytes:
    return x.to_bytes(4, "big")


def le32(x: int) -> bytes:
    return x.to_bytes(4, "little")


def scalar_bytes(x: int) -> bytes:
    """A scalar as 32 bytes little-endian, canonical."""
    if not 0 <= x < R:
        raise ValueError("not a canonical scalar")
    return x.to_bytes(32, "little")


def scalar_from_bytes(b: bytes) -> int:
    """32 little-endian bytes as a scalar; refuses a value not below r."""
    if len(b) != 32:
        raise ProtocolError(f"a scalar is 32 bytes, not {len(b)}")
    x = int.from_bytes(b, "little")
    if x >= R:
        raise ProtocolError("a scalar that is not canonical (not below r)")
    return x


def random_scalar() -> int:
    """Uniform on the field: 64 random bytes reduced mod r."""
    return int.from_bytes(os.urandom(64), "little") % R


def words_to_b64(words: Iterable[int]) -> str:
    """A vector on Z/2^32 as little-endian u32, base64."""
    words = list(words)
    return b64(struct.pack(f"<{len(words)}I", *words))


def b64_to_words(text: str) -> list[int]:
    data = unb64(text)
    if len(data) % 4:
        raise ProtocolError("not whole u32 words")
    return list(struct.unpack(f"<{len(data) // 4}I", data))


# ---------------------------------------------------------------------------------------
# Derivations (docs/SECAGG.md, "Derivations").


def hkdf(ikm: bytes, round_id: str, purpose: str, *ids: int) -> bytes:
    """HKDF-SHA256 with salt = the round id, info = label ‖ purpose ‖ be32(id)…, 32 bytes."""
    info = LABEL + purpose.encode() + b"".join(be32(i) for i in ids)
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=round_id.encode(), info=info).derive(ikm)


def x25519_public(secret: X25519PrivateKey) -> bytes:
    return secret.public_key().public_bytes_raw()


def x25519(secret: X25519PrivateKey, public: bytes) -> bytes:
    return secret.exchange(X25519PublicKey.from_public_bytes(public))


def mask_secret(round_id: str, sigma: int) -> X25519PrivateKey:
    """The X25519 secret a client masks with: HKDF(σ, "mask-key"), no id (the key is
    advertised before the server assigns the id). X25519 clamps it, as usual."""
    return X25519PrivateKey.from_private_bytes(hkdf(scalar_bytes(sigma), round_id, "mask-key"))


def mask_key(round_id: str, sigma: int) -> bytes:
    """The public mask key a client advertises."""
    return x25519_public(mask_secret(round_id, sigma))


def self_mask_key(round_id: str, client: int, beta: int) -> bytes:
    return hkdf(scalar_bytes(beta), round_id, "self-mask", client)


def self_mask_commitment(round_id: str, client: int, beta: int) -> bytes:
    rid = round_id.encode()
    return hashlib.sha256(
        LABEL + b"self-mask-commitment" + be32(len(rid)) + rid + be32(client) + scalar_bytes(beta)
    ).digest()


def pair_mask_key(round_id: str, mine: X25519PrivateKey, u: int, v: int, theirs: bytes) -> bytes:
    """The key of the mask u and v share (either order gives the same key)."""
    return hkdf(x25519(mine, theirs), round_id, "pair-mask", min(u, v), max(u, v))


def share_key(round_id: str, mine: X25519PrivateKey, sender: int, recipient: int,
              theirs: bytes) -> bytes:
    """The key of the one message from `sender` to `recipient`."""
    return hkdf(x25519(mine, theirs), round_id, "share", sender, recipient)


def share_aad(round_id: str, sender: int, recipient: int) -> bytes:
    return LABEL + b"share/" + round_id.encode() + be32(sender) + be32(recipient)


def seal_share(round_id: str, mine: X25519PrivateKey, sender: int, recipient: int,
               recipient_share_key: bytes, sigma_share: int, beta_share: int) -> bytes:
    """The 88-byte sealed share message from `sender` to `recipient`."""
    plain = le32(sender) + le32(recipient) + scalar_bytes(sigma_share) + scalar_bytes(beta_share)
    key = share_key(round_id, mine, sender, recipient, recipient_share_key)
    return ChaCha20Poly1305(key).encrypt(ZERO_NONCE, plain, share_aad(round_id, sender, recipient))


def open_share(round_id: str, mine: X25519PrivateKey, sender: int, recipient: int,
               sender_share_key: bytes, sealed: bytes) -> tuple[int, int]:
    """(σ share, β share) of a message from `sender` to `recipient`; refuses a message that
    does not open, or names other clients than the two it travelled between."""
    key = share_key(round_id, mine, sender, recipient, sender_share_key)
    try:
        plain = ChaCha20Poly1305(key).decrypt(ZERO_NONCE, sealed,
                                              share_aad(round_id, sender, recipient))
    except Exception as err:  # cryptography.exceptions.InvalidTag
        raise ProtocolError(f"the message from client {sender} does not open") from err
    if len(plain) != SHARE_PLAINTEXT_BYTES:
        raise ProtocolError(f"the message from client {sender} is {len(plain)} bytes")
    inner_sender, inner_recipient = struct.unpack("<II", plain[:8])
    if (inner_sender, inner_recipient) != (sender, recipient):
        raise ProtocolError(
            f"the message from client {sender} to {recipient} names {inner_sender} → {inner_recipient}")
    return scalar_from_bytes(plain[8:40]), scalar_from_bytes(plain[40:72])


# ---------------------------------------------------------------------------------------
# Shamir over the scalar field.


def shamir_shares(secret: int, threshold: int, holders: Sequence[int]) -> dict[int, int]:
    """A fresh random polynomial of degree t − 1 with `secret` at 0, at each holder's id."""
    coeffs = [secret] + [random_scalar() for _ in range(threshold - 1)]
    out = {}
    for x in holders:
        y = 0
        for c in reversed(coeffs):
            y = (y * x + c) % R
        out[x] = y
    return out


def lagrange_at_zero(points: Sequence[tuple[int, int]]) -> int:
    """The polynomial through the (id, share) points, at 0."""
    total = 0
    for i, (xi, yi) in enumerate(points):
        num = den = 1
        for j, (xj, _) in enumerate(points):
            if j != i:
                num = num * xj % R
                den = den * (xj - xi) % R
        total = (total + yi * num * pow(den, R - 2, R)) % R
    return total


# ---------------------------------------------------------------------------------------
# Masks and quantisation.


def chacha20_keystream(key: bytes, nbytes: int) -> bytes:
    """RFC 8439 ChaCha20 key stream: 32-byte key, zero 12-byte nonce, block counter from 0.
    (cryptography's ChaCha20 takes 16 bytes: le32 counter ‖ 12-byte nonce.)"""
    enc = Cipher(algorithms.ChaCha20(key, bytes(16)), mode=None).encryptor()
    return enc.update(bytes(nbytes))


def mask(key: bytes, length: int) -> list[int]:
    """Element i is the key stream's bytes 4i..4i+4 as a little-endian u32."""
    return list(struct.unpack(f"<{length}I", chacha20_keystream(key, 4 * length)))


def round_half_away_from_zero(v: Fraction) -> int:
    n = (abs(v) + Fraction(1, 2)).__floor__()
    return n if v >= 0 else -n


def quantise(x: float, clip: float, scale_bits: int) -> int:
    """q = round_half_away_from_zero(clamp(x, −clip, clip) · 2^f), as a u32 (two's
    complement). Exact: the product is taken on rationals."""
    clamped = min(max(Fraction(x), Fraction(-clip)), Fraction(clip))
    return round_half_away_from_zero(clamped * (1 << scale_bits)) % RING


def signed32(v: int) -> int:
    return v - RING if v >= 1 << 31 else v


def dequantise(v: int, scale_bits: int) -> float:
    """A ring value read as a signed 32-bit integer, divided by 2^f."""
    return signed32(v) / (1 << scale_bits)


# ---------------------------------------------------------------------------------------
# The neighbourhood graph.


class _Words:
    """Consecutive little-endian u32 words of the ChaCha20 key stream under a seed."""

    def __init__(self, seed: bytes):
        self._enc = Cipher(algorithms.ChaCha20(seed, bytes(16)), mode=None).encryptor()

    def next(self) -> int:
        return struct.unpack("<I", self._enc.update(bytes(4)))[0]

    def below(self, b: int) -> int:
        """Uniform on 0..b by rejection."""
        limit = 0xFFFFFFFF - ((0xFFFFFFFF % b) + 1) % b
        while True:
            w = self.next()
            if w <= limit:
                return w % b


def ring_order(clients: int, graph_seed: bytes) -> list[int]:
    """The ids 1..=n in the ring's order: Fisher–Yates from the last place down."""
    ring = list(range(1, clients + 1))
    words = _Words(graph_seed)
    for i in range(clients - 1, 0, -1):
        j = words.below(i + 1)
        ring[i], ring[j] = ring[j], ring[i]
    return ring


def neighbours(clients: int, degree: int, graph_seed: bytes, u: int) -> list[int]:
    """N(u), in increasing order: every other id when k = n − 1, else the ids k/2 places
    either side of u on the seeded ring."""
    if degree == clients - 1:
        return [v for v in range(1, clients + 1) if v != u]
    ring = ring_order(clients, graph_seed)
    p = ring.index(u)
    return sorted({ring[(p + s * d) % clients] for d in range(1, degree // 2 + 1) for s in (1, -1)})


# ---------------------------------------------------------------------------------------
# One participant.


@dataclass
class RoundInfo:
    """What a client reads from a RoundView (the generated model or its dict)."""

    id: str
    stage: str
    clients: int
    threshold: int
    neighbours: int
    vector_length: int
    clip: float
    scale_bits: int
    graph_seed: bytes
    members: dict[int, dict]

    @classmethod
    def of(cls, view) -> "RoundInfo":
        d = view if isinstance(view, dict) else view.to_dict()
        c = d["config"]
        seed = bytes.fromhex(c["graph_seed"])
        if len(seed) != 32:
            raise ProtocolError("graph_seed is not 32 bytes of hex")
        return cls(
            id=d["id"], stage=d["stage"], clients=c["clients"], threshold=c["threshold"],
            neighbours=c["neighbours"], vector_length=c["vector_length"], clip=c["clip"],
            scale_bits=c["scale_bits"], graph_seed=seed,
            members={m["id"]: m for m in d["clients"]},
        )

    def neighbours_of(self, u: int) -> list[int]:
        return neighbours(self.clients, self.neighbours, self.graph_seed, u)

    @property
    def shared(self) -> set[int]:  # U2
        return {i for i, m in self.members.items() if m["shared"]}

    @property
    def uploaded(self) -> set[int]:  # U3
        return {i for i, m in self.members.items() if m["uploaded"]}


@dataclass
class SecAggClient:
    """One client of one round. The secrets σ, β and the share key pair are drawn here and
    never leave it except as shares sealed to neighbours (and the revealed ones)."""

    round_id: str
    sigma: int = field(default_factory=random_scalar)
    beta: int = field(default_factory=random_scalar)
    share_secret: X25519PrivateKey = field(default_factory=X25519PrivateKey.generate)
    id: int | None = None
    token: str | None = None
    # (σ share, β share) of each neighbour that sealed one to this client.
    held: dict[int, tuple[int, int]] = field(default_factory=dict)

    # -- keys -------------------------------------------------------------------------

    @property
    def share_key(self) -> bytes:
        return x25519_public(self.share_secret)

    @property
    def mask_key(self) -> bytes:
        return mask_key(self.round_id, self.sigma)

    def register_body(self) -> dict:
        return {"share_key": b64(self.share_key), "mask_key": b64(self.mask_key)}

    def registered(self, answer) -> None:
        d = answer if isinstance(answer, dict) else answer.to_dict()
        self.id, self.token = d["client_id"], d["token"]
        me = RoundInfo.of(d["round"]).members.get(self.id)
        if me is None or unb64(me["mask_key"]) != self.mask_key or unb64(me["share_key"]) != self.share_key:
            raise ProtocolError("the round does not show the keys this client registered")

    # -- share_keys -------------------------------------------------------------------

    def shares_body(self, info: RoundInfo) -> dict:
        """Stage share_keys: σ and β shared (degree t − 1) among N(u) ∩ U1, each pair of
        shares sealed to its holder, and the commitment to β."""
        if info.stage != "share_keys":
            raise ProtocolError(f"the round is at {info.stage}, not share_keys")
        holders = [v for v in info.neighbours_of(self.id) if v in info.members]
        if len(holders) < info.threshold:
            raise ProtocolError(f"{len(holders)} registered neighbours, threshold {info.threshold}")
        sigma_shares = shamir_shares(self.sigma, info.threshold, holders)
        beta_shares = shamir_shares(self.beta, info.threshold, holders)
        messages = []
        for v in holders:
            their_key = unb64(info.members[v]["share_key"])
            sealed = seal_share(self.round_id, self.share_secret, self.id, v, their_key,
                                sigma_shares[v], beta_shares[v])
            assert len(sealed) == SHARE_CIPHERTEXT_BYTES
            messages.append({"recipient": v, "ciphertext": b64(sealed)})
        commitment = self_mask_commitment(self.round_id, self.id, self.beta)
        return {"self_mask_commitment": b64(commitment), "messages": messages}

    # -- masked_input -----------------------------------------------------------------

    def open_inbox(self, info: RoundInfo, inbox) -> None:
        """Opens the messages sealed to this client: exactly one from each v ∈ N(u) ∩ U2,
        each opening under the key agreed with v's advertised share key."""
        d = inbox if isinstance(inbox, dict) else inbox.to_dict()
        if d["client_id"] != self.id:
            raise ProtocolError(f"the inbox is client {d['client_id']}'s, not {self.id}'s")
        expected = sorted(v for v in info.neighbours_of(self.id) if v in info.shared)
        senders = [m["sender"] for m in d["messages"]]
        if sorted(senders) != expected or len(set(senders)) != len(senders):
            raise ProtocolError(f"messages from {senders}, expected one from each of {expected}")
        self.held = {}
        for m in d["messages"]:
            v = m["sender"]
            self.held[v] = open_share(self.round_id, self.share_secret, v, self.id,
                                      unb64(info.members[v]["share_key"]), unb64(m["ciphertext"]))

    def masked_words(self, info: RoundInfo, values: Sequence[float]) -> list[int]:
        """y = q + mask(self-mask key) + Σ_{v ∈ N(u) ∩ U2} s(u, v) · mask(pair-mask key),
        s = +1 for u < v and −1 for u > v, on Z/2^32."""
        if len(values) != info.vector_length:
            raise ProtocolError(f"{len(values)} values, vector_length {info.vector_length}")
        n = info.vector_length
        y = [quantise(x, info.clip, info.scale_bits) for x in values]
        terms = [(self_mask_key(self.round_id, self.id, self.beta), 1)]
        mine = mask_secret(self.round_id, self.sigma)
        for v in info.neighbours_of(self.id):
            if v in info.shared:
                key = pair_mask_key(self.round_id, mine, self.id, v, unb64(info.members[v]["mask_key"]))
                terms.append((key, 1 if self.id < v else -1))
        for key, sign in terms:
            y = [(a + sign * w) % RING for a, w in zip(y, mask(key, n))]
        return y

    def input_body(self, info: RoundInfo, values: Sequence[float]) -> dict:
        if info.stage != "masked_input":
            raise ProtocolError(f"the round is at {info.stage}, not masked_input")
        if self.id not in info.shared:
            raise ProtocolError("this client sent no shares: it may not upload")
        if set(self.held) != {v for v in info.neighbours_of(self.id) if v in info.shared}:
            raise ProtocolError("the inbox has not been opened for this U2")
        return {"masked": words_to_b64(self.masked_words(info, values))}

    # -- unmasking --------------------------------------------------------------------

    def unmask_body(self, info: RoundInfo) -> dict:
        """For each v ∈ N(u) ∩ U2: v's β share if v uploaded, else v's σ share; never
        both for one owner."""
        if info.stage != "unmasking":
            raise ProtocolError(f"the round is at {info.stage}, not unmasking")
        if len(info.uploaded) < info.threshold:
            raise ProtocolError(f"{len(info.uploaded)} uploaders, threshold {info.threshold}")
        if self.id not in info.uploaded:
            raise ProtocolError("this client did not upload: it reveals nothing")
        shares = []
        for v in info.neighbours_of(self.id):
            if v not in info.shared:
                continue
            sigma_share, beta_share = self.held[v]
            if v in info.uploaded:
                shares.append({"owner": v, "secret": "self_mask", "share": b64(scalar_bytes(beta_share))})
            else:
                shares.append({"owner": v, "secret": "mask_key", "share": b64(scalar_bytes(sigma_share))})
        return {"shares": shares}

    # -- the calls, through the generated client -------------------------------------

    def register_via(self, api) -> None:
        from gpu_ops_client.api.secagg import secagg_register
        from gpu_ops_client.models import RegisterRequest, RegisterResponse

        resp = secagg_register.sync_detailed(
            self.round_id, client=api, body=RegisterRequest.from_dict(self.register_body()))
        self.registered(_expect(resp, 201, RegisterResponse))

    def round_via(self, api) -> RoundInfo:
        return fetch_round(api, self.round_id)

    def send_shares_via(self, api) -> RoundInfo:
        from gpu_ops_client.api.secagg import secagg_shares
        from gpu_ops_client.models import SharesRequest, SubmissionResponse

        body = SharesRequest.from_dict(self.shares_body(self.round_via(api)))
        resp = secagg_shares.sync_detailed(self.round_id, client=api, body=body,
                                           x_secagg_token=self.token)
        return RoundInfo.of(_expect(resp, 200, SubmissionResponse).round_)

    def read_inbox_via(self, api) -> None:
        from gpu_ops_client.api.secagg import secagg_inbox
        from gpu_ops_client.models import InboxResponse

        info = self.round_via(api)
        resp = secagg_inbox.sync_detailed(self.round_id, client=api, x_secagg_token=self.token)
        self.open_inbox(info, _expect(resp, 200, InboxResponse))

    def upload_via(self, api, values: Sequence[float], *, bulk: bool = False) -> RoundInfo:
        """The masked vector as JSON (base64 words), or with `bulk` as a u32 array in the
        bulk form (docs/WIRE.md), sent as the generated client's File body."""
        from gpu_ops_client.api.secagg import secagg_input
        from gpu_ops_client.models import InputRequest, SubmissionResponse

        sent = self.input_body(self.round_via(api), values)
        if bulk:
            import io

            import numpy as np
            from gpu_ops_client.types import File

            from bulk import bulk_body

            words = np.array(b64_to_words(sent["masked"]), dtype=np.uint32)
            body = File(payload=io.BytesIO(bulk_body({}, {"masked": words})))
        else:
            body = InputRequest.from_dict(sent)
        resp = secagg_input.sync_detailed(self.round_id, client=api, body=body,
                                          x_secagg_token=self.token)
        return RoundInfo.of(_expect(resp, 200, SubmissionResponse).round_)

    def reveal_via(self, api) -> RoundInfo:
        from gpu_ops_client.api.secagg import secagg_unmask
        from gpu_ops_client.models import SubmissionResponse, UnmaskRequest

        body = UnmaskRequest.from_dict(self.unmask_body(self.round_via(api)))
        resp = secagg_unmask.sync_detailed(self.round_id, client=api, body=body,
                                           x_secagg_token=self.token)
        return RoundInfo.of(_expect(resp, 200, SubmissionResponse).round_)


def _expect(resp, status: int, model):
    if resp.status_code != status or not isinstance(resp.parsed, model):
        raise ProtocolError(f"expected {status} {model.__name__}, got HTTP {int(resp.status_code)}: "
                            f"{resp.content[:800]!r}")
    return resp.parsed


def fetch_round(api, round_id: str) -> RoundInfo:
    from gpu_ops_client.api.secagg import secagg_round_get
    from gpu_ops_client.models import RoundView

    return RoundInfo.of(_expect(secagg_round_get.sync_detailed(round_id, client=api), 200, RoundView))


@dataclass
class Coordinator:
    """The round's creator: it holds the coordinator token."""

    round_id: str
    token: str

    @classmethod
    def create_via(cls, api, **params) -> "Coordinator":
        from gpu_ops_client.api.secagg import secagg_round_create
        from gpu_ops_client.models import CreateRoundRequest, CreateRoundResponse

        resp = secagg_round_create.sync_detailed(client=api, body=CreateRoundRequest.from_dict(params))
        created = _expect(resp, 201, CreateRoundResponse)
        return cls(created.id, created.coordinator_token)

    def advance_via(self, api) -> RoundInfo:
        from gpu_ops_client.api.secagg import secagg_round_advance
        from gpu_ops_client.models import RoundView

        resp = secagg_round_advance.sync_detailed(self.round_id, client=api, x_secagg_token=self.token)
        return RoundInfo.of(_expect(resp, 200, RoundView))

    def result_via(self, api):
        from gpu_ops_client.api.secagg import secagg_round_result
        from gpu_ops_client.models import RoundResult

        resp = secagg_round_result.sync_detailed(self.round_id, client=api, x_secagg_token=self.token)
        return _expect(resp, 200, RoundResult)


def run_round(api, inputs: Sequence[Sequence[float]], *, threshold: int, neighbours: int | None = None,
              clip: float = 1.0, scale_bits: int = 16, drop_after_shares: Iterable[int] = (),
              wait_s: float = 30.0, bulk: bool = False):
    """One whole round: len(inputs) clients register in order (ids 1..=n), all send their
    shares, those not in `drop_after_shares` upload (in the bulk form with `bulk`; the
    coordinator closes masked_input when someone dropped) and reveal. Returns
    (coordinator, clients, result)."""
    import time

    n = len(inputs)
    params = dict(clients=n, threshold=threshold, vector_length=len(inputs[0]), clip=clip,
                  scale_bits=scale_bits)
    if neighbours is not None:
        params["neighbours"] = neighbours
    coord = Coordinator.create_via(api, **params)
    parties = [SecAggClient(coord.round_id) for _ in range(n)]
    for p in parties:
        p.register_via(api)
    for p in parties:
        p.send_shares_via(api)
    dropped = set(drop_after_shares)
    survivors = [p for p in parties if p.id not in dropped]
    for p in survivors:
        p.read_inbox_via(api)
        p.upload_via(api, inputs[p.id - 1], bulk=bulk)
    if dropped:
        coord.advance_via(api)
    for p in survivors:
        p.reveal_via(api)
    deadline = time.monotonic() + wait_s
    while fetch_round(api, coord.round_id).stage == "aggregating":
        if time.monotonic() > deadline:
            raise ProtocolError(f"still aggregating after {wait_s} s")
        time.sleep(0.05)
    return coord, parties, coord.result_via(api)
