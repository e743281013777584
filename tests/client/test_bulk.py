"""The bulk wire form from NumPy (docs/WIRE.md): arrays sent through the generated
client as a File body built by tests/client/bulk.py, and answers read back as arrays by
the same helper. The answers hold the JSON form's bits."""

import base64
import inspect
import io
from pathlib import Path

import numpy as np

import bulk
from bulk import MEDIA_TYPE, bulk_body, read_bulk

# conftest.py puts the generated client on the path or fails the run: an import that
# breaks (a model renamed) fails here too, and nothing is skipped.
from gpu_ops_client.api.linalg import matmul
from gpu_ops_client.api.zk import field_add
from gpu_ops_client.models import (
    Field,
    FieldBinaryRequest,
    FieldVectorResponse,
    MatmulRequest,
    MatmulResponse,
    PackedTensor,
    ProblemDocument,
)
from gpu_ops_client.types import File

GOLDILOCKS = 2**64 - 2**32 + 1


def bulk_answer(client, path: str, body: bytes):
    """Posts a bulk body asking for a bulk answer; the answer's header and arrays."""
    resp = client.get_httpx_client().post(
        path, content=body, headers={"content-type": MEDIA_TYPE, "accept": MEDIA_TYPE})
    assert resp.status_code == 200, resp.content[:800]
    assert resp.headers["content-type"] == MEDIA_TYPE
    return read_bulk(resp.content)


def test_matmul_takes_numpy_arrays_and_answers_one(client):
    rng = np.random.default_rng(7)
    a = rng.standard_normal((2, 3, 5), dtype=np.float32)
    b = rng.standard_normal((5, 4), dtype=np.float32)
    body = bulk_body({"alpha": 0.5}, {"a": a, "b": b})

    # Through the generated client: the bulk body is a File; the answer is JSON, packed
    # (the operands stated their dtype).
    r = matmul.sync_detailed(client=client, body=File(payload=io.BytesIO(body))).parsed
    assert isinstance(r, MatmulResponse), r
    assert isinstance(r.result, PackedTensor) and r.shape == [2, 3, 4]
    from_json = np.frombuffer(base64.b64decode(r.result.data), "<f4").reshape(r.shape)
    np.testing.assert_allclose(from_json, 0.5 * (a @ b), rtol=1e-5, atol=1e-5)

    # The bulk answer, read by the helper: the same bits as an array.
    header, arrays = bulk_answer(client, "/linalg/matmul", body)
    assert header["shape"] == [2, 3, 4] and header["dtype"] == "f32"
    assert arrays["result"].dtype == np.float32
    np.testing.assert_array_equal(arrays["result"], from_json)

    # The same operands as nested JSON numbers give the same product.
    nested = MatmulRequest.from_dict({"a": a.tolist(), "b": b.tolist(), "alpha": 0.5})
    r = matmul.sync_detailed(client=client, body=nested).parsed
    np.testing.assert_array_equal(np.array(r.result, dtype=np.float32), from_json)


def test_field_add_takes_numpy_words_and_answers_them(client):
    a = np.array([1, 2, GOLDILOCKS - 1, 12345678901234], dtype=np.uint64)
    b = np.array([5], dtype=np.uint64)
    header, arrays = bulk_answer(client, "/zk/field_add",
                                 bulk_body({"field": "goldilocks"}, {"a": a, "b": b}))
    want = [(int(x) + 5) % GOLDILOCKS for x in a]
    assert header["length"] == 4
    assert arrays["result"].dtype == np.uint64 and arrays["result"].tolist() == want
    # The JSON answer to the JSON request agrees.
    r = field_add.sync_detailed(client=client, body=FieldBinaryRequest(
        field=Field.GOLDILOCKS, a=[str(x) for x in a], b=["5"])).parsed
    assert isinstance(r, FieldVectorResponse) and [int(x) for x in r.result] == want


def test_he_keys_ciphertexts_and_slots_travel_as_numpy_arrays(client):
    """The dealer's calls in the bulk form: keys and ciphertexts as uint8 arrays, slots as
    uint64; decryption gives back the slots encrypted, and the JSON form agrees."""
    params = "bfv128_n4096"
    resp = client.get_httpx_client().post(
        "/he/keys", json={"parameters": params}, headers={"accept": MEDIA_TYPE})
    assert resp.status_code == 200 and resp.headers["content-type"] == MEDIA_TYPE
    header, keys = read_bulk(resp.content)
    assert header["slots"] == 4096
    assert keys["public_key"].dtype == np.uint8 and keys["secret_key"].dtype == np.uint8

    values = np.arange(1000, 1300, dtype=np.uint64)
    _, sealed = bulk_answer(client, "/he/encrypt", bulk_body(
        {"parameters": params}, {"public_key": keys["public_key"], "values": values}))
    ciphertext = sealed["ciphertext"]
    assert ciphertext.dtype == np.uint8 and ciphertext.size > 0

    _, opened = bulk_answer(client, "/he/decrypt", bulk_body(
        {"parameters": params}, {"secret_key": keys["secret_key"], "ciphertext": ciphertext}))
    slots = opened["values"]
    assert slots.dtype == np.uint64 and slots.shape == (4096,)
    np.testing.assert_array_equal(slots[:300], values)
    assert not slots[300:].any()

    as_json = client.get_httpx_client().post("/he/decrypt", json={
        "parameters": params,
        "secret_key": base64.b64encode(keys["secret_key"].tobytes()).decode(),
        "ciphertext": base64.b64encode(ciphertext.tobytes()).decode()})
    assert as_json.status_code == 200 and as_json.json()["values"] == slots.tolist()


def test_secagg_masked_uploads_and_the_sum_travel_as_numpy_arrays(client):
    """A round whose clients upload their masked words as u32 arrays; the coordinator
    reads the sum (f64) and the ring sum (u32) as arrays, with the JSON answer's values."""
    import secagg_client as sa

    inputs = [[0.25, -0.5, 0.125, 1.0], [0.5, 0.5, -0.75, -1.0], [-0.125, 0.0, 0.375, 0.5]]
    coord, _, r = sa.run_round(client, inputs, threshold=2, clip=1.0, scale_bits=16, bulk=True)
    assert r.clients == [1, 2, 3] and r.dropped == []
    assert r.sum_ == [sum(col) for col in zip(*inputs)]  # exact: multiples of 1/8
    resp = client.get_httpx_client().get(
        f"/secagg/rounds/{coord.round_id}/result",
        headers={"accept": MEDIA_TYPE, "x-secagg-token": coord.token})
    assert resp.status_code == 200 and resp.headers["content-type"] == MEDIA_TYPE
    header, arrays = read_bulk(resp.content)
    assert header["clients"] == [1, 2, 3]
    assert arrays["sum"].dtype == np.float64 and arrays["sum"].tolist() == r.sum_
    assert arrays["ring_sum"].dtype == np.uint32
    assert arrays["ring_sum"].tolist() == sa.b64_to_words(r.ring_sum)


def test_a_broken_body_is_refused_with_the_member_at_fault(client):
    a = np.ones((2, 2), dtype=np.float32)
    body = bytearray(bulk_body({}, {"a": a, "b": a}))
    resp = matmul.sync_detailed(client=client, body=File(payload=io.BytesIO(bytes(body[:-8]))))
    p = resp.parsed
    assert resp.status_code == 422 and isinstance(p, ProblemDocument), resp.content
    assert p.code == "invalid_buffer" and p.errors[0].path == "/b/byte_length"
    resp = matmul.sync_detailed(client=client, body=File(payload=io.BytesIO(b"\x01\x02")))
    assert resp.status_code == 400 and resp.parsed.code == "malformed_bulk_body"


def test_the_wire_page_shows_this_helper():
    page = (Path(__file__).resolve().parents[2] / "docs" / "WIRE.md").read_text()
    for code in (inspect.getsource(bulk.bulk_body), inspect.getsource(bulk.read_bulk)):
        assert code in page, code
    assert (
        'DTYPES = {"f16": "<f2", "f32": "<f4", "f64": "<f8", "u8": "<u1", "u32": "<u4", "u64": "<u8",\n'
        '          "cf32": "<c8"}') in page
