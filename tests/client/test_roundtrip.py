"""Every operation of openapi/openapi.json round-tripped through the client that
openapi-python-client generates from it, against a real server (conftest.py):

- one success per operation, its typed answer (`.parsed` of the right model class)
  checked against a value worked out independently;
- one refusal per operation, decoded as a `ProblemDocument` with its stable `code` and,
  where a field is to blame, the JSON pointer of the first error;
- a coverage check: the spec's operation ids are exactly those with a success test and
  a refusal (or a stated reason for having none), so a new operation without its round
  trip fails here.
"""

import base64
import hashlib
import io
import json
import math
import random
import signal
import struct
import tarfile
import time
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal, localcontext
from typing import Callable

import pyarrow.parquet as pq
import pytest

try:
    from gpu_ops_client.api.datasets import (
        dataset_cancel,
        dataset_create,
        dataset_delete,
        dataset_events,
        dataset_features,
        dataset_get,
        dataset_list,
        dataset_resume,
        dataset_sample_iq,
    )
    from gpu_ops_client.api.dp import (
        dp_accountant_epsilon,
        dp_accountant_noise_multiplier,
        dp_budget_create,
        dp_budget_get,
        dp_budget_list,
        dp_gaussian,
        dp_laplace,
        dp_privatize,
    )
    from gpu_ops_client.api.arrays import (
        array_create,
        array_data,
        array_delete,
        array_get,
        array_list,
    )
    from gpu_ops_client.api.beams import beam_channels, beam_sweep
    from gpu_ops_client.api.embeddings import (
        embedding_table_create,
        embedding_table_delete,
        embedding_table_get,
        embedding_table_list,
        embedding_table_lookup,
        embeddings_sinusoidal,
    )
    from gpu_ops_client.api.he import he_aggregate, he_decrypt, he_encrypt, he_keys
    from gpu_ops_client.api.linalg import matmul
    from gpu_ops_client.api.mpc import shamir_combine, shamir_split, shamir_verify
    from gpu_ops_client.api.secagg import (
        secagg_inbox,
        secagg_input,
        secagg_register,
        secagg_round_advance,
        secagg_round_create,
        secagg_round_get,
        secagg_round_result,
        secagg_shares,
        secagg_unmask,
    )
    from gpu_ops_client.api.nn import attention, conv2d
    from gpu_ops_client.api.rf import rf_features, rf_iq
    from gpu_ops_client.api.system import (
        device_bandwidth,
        device_batch_hint,
        device_info,
        health_live,
        health_ready,
        metrics,
    )
    from gpu_ops_client.api.zk import (
        field_add,
        field_inv,
        field_mul,
        field_pow,
        field_sub,
        intt,
        msm,
        ntt,
    )
    from gpu_ops_client.models import (
        AffinePointDoc,
        ArrayDataResponse,
        ArrayKind,
        ArrayList,
        ArrayRefDoc,
        ArrayView,
        CreateArrayRequest,
        Keep,
        HeAggregateRequest,
        HeCiphertextResponse,
        HeDecryptRequest,
        HeDecryptResponse,
        HeEncryptRequest,
        HeKeysRequest,
        HeKeysResponse,
        ParameterSet,
        ShamirCombineRequest,
        ShamirCombineResponse,
        ShamirSplitRequest,
        ShamirSplitResponse,
        ShamirVerifyRequest,
        ShamirVerifyResponse,
        ShareIn,
        CreateRoundRequest,
        CreateRoundResponse,
        InboxResponse,
        InputRequest,
        RegisterRequest,
        RegisterResponse,
        RevealedShareIn,
        RoundResult,
        RoundView,
        SealedShareIn,
        Secret,
        SharesRequest,
        Stage,
        SubmissionResponse,
        UnmaskRequest,
        ArrayGeometry,
        BeamDtype,
        ChannelModel,
        ChannelsRequest,
        ChannelsResponse,
        CodebookSpec,
        CreateTableRequest,
        EmbeddingDtype,
        LookupRequest,
        LookupResponse,
        TableList,
        TableView,
        SweepRequest,
        SweepResponse,
        AttentionRequest,
        AttentionResponse,
        Conv2DRequest,
        Conv2DResponse,
        BackendChoice,
        BackendKind,
        BandwidthReport,
        BatchHint,
        BinaryEncoding,
        BudgetDetail,
        BudgetList,
        BudgetView,
        CreateBudgetRequest,
        CreateDatasetRequest,
        Curve,
        DatasetList,
        DatasetSampleIqFormat,
        DatasetStatus,
        DatasetType,
        DatasetView,
        DeviceReport,
        Dtype,
        Encoding,
        EpsilonRequest,
        EpsilonResponse,
        Field,
        FieldBinaryRequest,
        FieldInvRequest,
        FieldPowRequest,
        FieldVectorResponse,
        GaussianRequest,
        Geometry,
        HealthStatus,
        HintOp,
        LaplaceRequest,
        MechanismResponse,
        MatmulRequest,
        MatmulResponse,
        MsmRequest,
        SinusoidalRequest,
        SinusoidalResponse,
        MsmResponse,
        NoiseMultiplierRequest,
        NoiseMultiplierResponse,
        NttRequest,
        Packed,
        PrivacyReport,
        PrivatizeRequest,
        PrivatizeResponse,
        ProblemDocument,
        Quality,
        RecordingFormat,
        RfFeaturesRequest,
        RfFeaturesResponse,
        RfIqRequest,
        RfIqResponse,
        Scenario,
        Signal,
    )
    from gpu_ops_client.types import File
except ImportError as err:
    pytest.fail(
        f"importing the generated client failed ({err}): set GPU_OPS_CLIENT_DIR to the directory "
        "holding a gpu_ops_client generated from openapi/openapi.json (scripts/client-check.sh "
        "makes one)",
        pytrace=False,
    )

# The second, independent SecAgg client (docs/SECAGG.md in Python, with `cryptography`).
import secagg_client as sa  # noqa: E402

GOLDILOCKS_P = 2**64 - 2**32 + 1
BN254_R = 21888242871839275222246405745257275088548364400416034343698204186575808495617
BABYBEAR_P = 2013265921
BN254_G = (1, 2)
BN254_2G = (
    1368015179489954701390400359078579693043519447331113978918064868415326638035,
    9918110051302171585080402603319702774565515993150576347155970296011118125764,
)
ACCOUNTANT_CASE = dict(sample_rate=0.04, steps=2250, delta=1e-5)  # README's example
ACCOUNTANT_EPSILON = 7.3291111714386545  # at noise_multiplier 1.5
GRADIENTS = [[0.5, -1.0, 2.0], [3.0, 0.0, -4.0]]  # row norms √5.25 and 5
TERMINAL = {
    DatasetStatus.COMPLETED,
    DatasetStatus.FAILED,
    DatasetStatus.CANCELLED,
    DatasetStatus.INTERRUPTED,
}


# ---------------------------------------------------------------------------------------
# Registry: which operations have a success test and which a refusal.

SUCCESS: set[str] = set()


def roundtrip(*operation_ids: str):
    """Marks a test as the success round trip of `operation_ids`."""

    def mark(test):
        SUCCESS.update(operation_ids)
        return test

    return mark


@dataclass(frozen=True)
class Refusal:
    op: str
    call: Callable
    status: int
    code: str
    path: str | None


REFUSALS: list[Refusal] = []


def refusal(op: str, status: int, code: str, path: str | None = None):
    """Registers `call(ctx)` as the refusal of operation `op`: it must answer `status` with a
    problem document of `code` whose first error points at `path` (when given)."""

    def register(call):
        REFUSALS.append(Refusal(op, call, status, code, path))
        return call

    return register


# Open operations without input: their only documented refusals are 500 (a bug) and, for
# health_ready, 503 while the server is still starting or already draining, which no
# test can reach deterministically (and they take no key, so there is no 401 either).
# device_bandwidth's one input is a boolean, which a typed client cannot get wrong.
NO_REFUSAL = {"health_live", "health_ready", "device_info", "metrics", "device_bandwidth"}


# ---------------------------------------------------------------------------------------
# Helpers.


def explain(resp) -> str:
    return f"HTTP {int(resp.status_code)}: {resp.content[:800]!r}"


def ok(resp, status: int, model):
    """The typed answer of a success: `status`, parsed as `model`."""
    assert resp.status_code == status, explain(resp)
    assert isinstance(resp.parsed, model), (
        f"parsed as {type(resp.parsed).__name__}, not {model.__name__}: {explain(resp)}"
    )
    return resp.parsed


def problem(resp, status: int, code: str, path: str | None = None) -> ProblemDocument:
    """The refusal's problem document: `status`, `code`, and the first error at `path`."""
    assert resp.status_code == status, explain(resp)
    assert resp.headers["content-type"] == "application/problem+json", explain(resp)
    p = resp.parsed
    assert isinstance(p, ProblemDocument), explain(resp)
    assert (p.status, p.code, p.type_) == (status, code, f"urn:gpu-ops:problem:{code}"), p
    if path is not None:
        assert p.errors and p.errors[0].path == path, p.errors
    return p


def le64(*values: int, width: int) -> str:
    """Base64 of `values` as little-endian integers of `width` bytes each."""
    return base64.b64encode(b"".join(v.to_bytes(width, "little") for v in values)).decode()


def f32_base64(values) -> str:
    return base64.b64encode(struct.pack(f"<{len(values)}f", *values)).decode()


def tone_iq(offset_hz: float, sample_rate_hz: float, n: int) -> str:
    """Base64 of a unit complex exponential at `offset_hz`: interleaved f32 I/Q."""
    phases = (2 * math.pi * offset_hz * k / sample_rate_hz for k in range(n))
    return f32_base64([v for ph in phases for v in (math.cos(ph), math.sin(ph))])


def reference_ntt(values: list[int], p: int, generator: int) -> list[int]:
    """X_k = Σ_j x_j·ω^(jk) with ω = g^((p−1)/n): the README's transform, natural order."""
    n = len(values)
    w = pow(generator, (p - 1) // n, p)
    return [sum(x * pow(w, j * k, p) for j, x in enumerate(values)) % p for k in range(n)]


def dataset_request(name: str, num_samples: int, dataset_type: DatasetType,
                    duration_ms: float = 100, chunk_ms: float = 50) -> CreateDatasetRequest:
    """A dataset every sample passes (4 receivers, quality gates wide open); with 100 ms
    recordings in 50 ms chunks a couple of samples take about a second (as `small()` in
    tests/http/datasets.rs)."""
    return CreateDatasetRequest(
        name=name,
        num_samples=num_samples,
        dataset_type=dataset_type,
        seed=1,
        config=Scenario(
            chunk_ms=chunk_ms,
            signal=Signal(duration_ms=duration_ms),
            geometry=Geometry(receivers_min=4, receivers_max=4),
            quality=Quality(min_receivers=1, min_snr_db=-50, max_gdop=1e9),
        ),
    )


def long_dataset_request(name: str) -> CreateDatasetRequest:
    """Far more work than a test waits for (minutes), still running when the test cancels or
    kills it, in short batches, so that a cancellation takes effect within seconds."""
    return dataset_request(name, 1000, DatasetType.FEATURE_BASED)


def create_dataset(client, body: CreateDatasetRequest) -> DatasetView:
    return ok(dataset_create.sync_detailed(client=client, body=body), 202, DatasetView)


def wait_for(client, dataset_id: str, statuses, timeout_s: float = 120) -> DatasetView:
    """Polls dataset_get until the job's status is one of `statuses`."""
    deadline = time.monotonic() + timeout_s
    while True:
        view = ok(dataset_get.sync_detailed(dataset_id, client=client), 200, DatasetView)
        if view.status in statuses:
            return view
        assert time.monotonic() < deadline, f"{dataset_id} still {view.status} after {timeout_s} s"
        time.sleep(0.1)


def wait_completed(client, dataset_id: str) -> DatasetView:
    view = wait_for(client, dataset_id, TERMINAL)
    assert view.status == DatasetStatus.COMPLETED, view
    return view


def sample_iq(client, dataset_id: str, fmt: DatasetSampleIqFormat | None):
    """Row 0, receiver 0 of the dataset through the generated client. Its parser is made
    from the spec's first 200 media type; an answer it cannot decode fails with why."""
    kwargs = {} if fmt is None else {"format_": fmt}
    try:
        return dataset_sample_iq.sync_detailed(dataset_id, 0, 0, client=client, **kwargs)
    except ValueError as err:  # JSONDecodeError, UnicodeDecodeError
        reason = type(err).__name__
    pytest.fail(
        f"the generated dataset_sample_iq cannot decode the format={fmt} answer ({reason}): "
        "it parses every 200 as JSON, the first of the media types the spec lists for it"
    )


# ---------------------------------------------------------------------------------------
# Shared fixtures.


@dataclass
class Dataset:
    created: DatasetView  # the 202 answer of dataset_create
    location: str  # its Location header
    done: DatasetView  # dataset_get once completed


@pytest.fixture(scope="module")
def iq_dataset(client) -> Dataset:
    """A completed two-sample `iq_raw` dataset."""
    body = dataset_request("roundtrip", 2, DatasetType.IQ_RAW)
    resp = dataset_create.sync_detailed(client=client, body=body)
    created = ok(resp, 202, DatasetView)
    return Dataset(created, resp.headers.get("location"), wait_completed(client, created.id))


@pytest.fixture(scope="module")
def budget(client) -> BudgetView:
    body = CreateBudgetRequest(epsilon_limit=8.0, delta=1e-5, name="roundtrip")
    return ok(dp_budget_create.sync_detailed(client=client, body=body), 201, BudgetView)


@dataclass
class Interrupted:
    client: object  # a client of the restarted server
    view: DatasetView  # the job as the restarted server first reports it


@pytest.fixture(scope="module")
def interrupted(start_server, connect, tmp_path_factory) -> Interrupted:
    """A dataset job left running by a server that was killed (SIGKILL), seen from a new
    server on the same data directory."""
    data = tmp_path_factory.mktemp("crashed")
    first = start_server(data)
    first_client = connect(first.url)
    job = create_dataset(first_client, long_dataset_request("crashed"))
    wait_for(first_client, job.id, {DatasetStatus.RUNNING})
    first.stop(signal.SIGKILL)
    client = connect(start_server(data).url)
    view = ok(dataset_get.sync_detailed(job.id, client=client), 200, DatasetView)
    return Interrupted(client, view)


class Ctx:
    """What refusal cases call with: the clients and, made on first use, a dataset id."""

    def __init__(self, request):
        self.client = request.getfixturevalue("client")
        self.anon = request.getfixturevalue("anon")
        self._request = request

    @property
    def dataset(self) -> str:
        return self._request.getfixturevalue("iq_dataset").done.id

    @property
    def secagg(self) -> "WaitingRound":
        return self._request.getfixturevalue("secagg_waiting")

    @property
    def no_dealer(self):
        """A client of a server without --he-dealer-mode."""
        server = self._request.getfixturevalue("no_dealer")
        return self._request.getfixturevalue("connect")(server.url)


@pytest.fixture
def ctx(request) -> Ctx:
    return Ctx(request)


# ---------------------------------------------------------------------------------------
# zk: field arithmetic, NTT, MSM.


@roundtrip("field_add")
def test_field_add(client):
    body = FieldBinaryRequest(field=Field.GOLDILOCKS, a=["1", "2"], b=["5"])
    resp = field_add.sync_detailed(client=client, body=body)
    r = ok(resp, 200, FieldVectorResponse)
    assert (r.field, r.encoding, r.length, r.result) == (
        Field.GOLDILOCKS, Encoding.DECIMAL, 2, ["6", "7"])
    assert resp.headers["x-backend"] == "cpu"  # a job's answer says where it ran
    # The README's base64 case: 8 little-endian bytes per goldilocks element.
    body = FieldBinaryRequest(field=Field.GOLDILOCKS, a=le64(1, width=8), b=le64(2, width=8),
                              encoding=Encoding.BASE64)
    r = ok(field_add.sync_detailed(client=client, body=body), 200, FieldVectorResponse)
    assert (r.encoding, r.length, r.result) == (Encoding.BASE64, 1, le64(3, width=8))


@refusal("field_add", 422, "invalid_field_element", "/a/1")
def refuse_field_add(c: Ctx):
    body = FieldBinaryRequest(field=Field.GOLDILOCKS, a=["1", str(GOLDILOCKS_P)], b=["5"])
    return field_add.sync_detailed(client=c.client, body=body)


@roundtrip("field_sub")
def test_field_sub(client):
    body = FieldBinaryRequest(field=Field.GOLDILOCKS, a=["0", "7"], b=["1", "5"])
    r = ok(field_sub.sync_detailed(client=client, body=body), 200, FieldVectorResponse)
    assert r.result == [str(GOLDILOCKS_P - 1), "2"]


@refusal("field_sub", 422, "length_mismatch", "/b")
def refuse_field_sub(c: Ctx):
    body = FieldBinaryRequest(field=Field.GOLDILOCKS, a=["1", "2"], b=["5", "1", "1"])
    return field_sub.sync_detailed(client=c.client, body=body)


@roundtrip("field_mul")
def test_field_mul(client):
    body = FieldBinaryRequest(field=Field.BN254_FR, a=["2", "0x10"], b=["3"])
    r = ok(field_mul.sync_detailed(client=client, body=body), 200, FieldVectorResponse)
    assert (r.field, r.length, r.result) == (Field.BN254_FR, 2, ["6", "48"])


@refusal("field_mul", 422, "invalid_field_element", "/a/0")
def refuse_field_mul(c: Ctx):  # the README's example: the modulus itself is not canonical
    body = FieldBinaryRequest(field=Field.BABYBEAR, a=[str(BABYBEAR_P)], b=["1"])
    return field_mul.sync_detailed(client=c.client, body=body)


@roundtrip("field_pow")
def test_field_pow(client):
    # 2^10; Fermat's 3^(p−1) = 1; and an exponent far above p (any 256-bit integer).
    bases, exponents = [2, 3, 5], [10, BABYBEAR_P - 1, 2**255 + 7]
    body = FieldPowRequest(field=Field.BABYBEAR, base=[str(b) for b in bases],
                           exponent=[str(e) for e in exponents])
    r = ok(field_pow.sync_detailed(client=client, body=body), 200, FieldVectorResponse)
    assert r.result[:2] == ["1024", "1"]
    assert r.result[2] == str(pow(5, 2**255 + 7, BABYBEAR_P))


@refusal("field_pow", 422, "length_mismatch", "/exponent")
def refuse_field_pow(c: Ctx):
    body = FieldPowRequest(field=Field.BABYBEAR, base=["2", "3", "4"], exponent=["1", "2"])
    return field_pow.sync_detailed(client=c.client, body=body)


@roundtrip("field_inv")
def test_field_inv(client):
    body = FieldInvRequest(field=Field.BABYBEAR, values=["2", "1"])
    r = ok(field_inv.sync_detailed(client=client, body=body), 200, FieldVectorResponse)
    assert r.result == ["1006632961", "1"]
    assert 2 * int(r.result[0]) % BABYBEAR_P == 1


@refusal("field_inv", 422, "not_invertible", "/values/1")
def refuse_field_inv(c: Ctx):
    body = FieldInvRequest(field=Field.BABYBEAR, values=["2", "0"])
    return field_inv.sync_detailed(client=c.client, body=body)


def transform(client, api, field: Field, values) -> list[str]:
    """The result of ntt or intt (`api`) of `values` in natural order."""
    body = NttRequest(field=field, values=[str(v) for v in values])
    return ok(api.sync_detailed(client=client, body=body), 200, FieldVectorResponse).result


@roundtrip("ntt")
def test_ntt(client):
    assert transform(client, ntt, Field.BABYBEAR, [1, 0, 0, 0]) == ["1", "1", "1", "1"]
    values = list(range(1, 9))
    assert transform(client, ntt, Field.GOLDILOCKS, values) == [
        str(v) for v in reference_ntt(values, GOLDILOCKS_P, 7)]


@refusal("ntt", 422, "invalid_parameter", "/values")
def refuse_ntt(c: Ctx):  # a size that is not a power of two
    body = NttRequest(field=Field.BABYBEAR, values=["1", "0", "0"])
    return ntt.sync_detailed(client=c.client, body=body)


@roundtrip("intt")
def test_intt(client):
    values = [3, 1, 4, 1, 5, 9, 2, 6]
    forward = transform(client, ntt, Field.GOLDILOCKS, values)
    assert transform(client, intt, Field.GOLDILOCKS, forward) == [str(v) for v in values]


@refusal("intt", 422, "invalid_field_element", "/values/0")
def refuse_intt(c: Ctx):
    body = NttRequest(field=Field.BABYBEAR, values=["0xZZ", "1"])
    return intt.sync_detailed(client=c.client, body=body)


@roundtrip("msm")
def test_msm(client):
    generator = AffinePointDoc(x=str(BN254_G[0]), y=str(BN254_G[1]))
    body = MsmRequest(curve=Curve.BN254_G1, scalars=["2"], points=[generator])
    r = ok(msm.sync_detailed(client=client, body=body), 200, MsmResponse)
    assert (r.curve, r.encoding, r.points) == (Curve.BN254_G1, Encoding.DECIMAL, 1)
    assert isinstance(r.result, AffinePointDoc), r
    assert (int(r.result.x), int(r.result.y)) == BN254_2G
    # base64: x ‖ y little-endian, 32 bytes each; scalars 32 bytes each.
    body = MsmRequest(curve=Curve.BN254_G1, encoding=Encoding.BASE64,
                      scalars=le64(2, width=32), points=le64(*BN254_G, width=32))
    r = ok(msm.sync_detailed(client=client, body=body), 200, MsmResponse)
    assert r.result == le64(*BN254_2G, width=32)
    # scalar_batch: one result per scalar vector, over the same points.
    body = MsmRequest(curve=Curve.BN254_G1, scalar_batch=[["1"], ["2"], ["0"]], points=[generator])
    r = ok(msm.sync_detailed(client=client, body=body), 200, MsmResponse)
    assert [None if p is None else (int(p.x), int(p.y)) for p in r.results] == [
        BN254_G, BN254_2G, None]


@refusal("msm", 422, "invalid_point", "/points/0")
def refuse_msm(c: Ctx):  # (1, 3) is not on y² = x³ + 3
    body = MsmRequest(curve=Curve.BN254_G1, scalars=["2"], points=[AffinePointDoc(x="1", y="3")])
    return msm.sync_detailed(client=c.client, body=body)


# ---------------------------------------------------------------------------------------
# arrays: operands kept for later requests.


@roundtrip("array_create", "array_get", "array_list", "array_data", "array_delete")
def test_arrays(client):
    # Keep the BN254 generator and the identity, sum over them by id, read them back.
    generator = AffinePointDoc(x=str(BN254_G[0]), y=str(BN254_G[1]))
    body = CreateArrayRequest(kind=ArrayKind.POINTS, curve=Curve.BN254_G1, points=[generator, None],
                              name="srs", ttl_seconds=600)
    a = ok(array_create.sync_detailed(client=client, body=body), 201, ArrayView)
    assert (a.kind, a.curve, a.length, a.size_bytes, a.held) == (
        ArrayKind.POINTS, Curve.BN254_G1, 2, 128, ["host", "disk"])
    assert a.data_url == f"/arrays/{a.id}/data"
    listed = ok(array_list.sync_detailed(client=client), 200, ArrayList)
    assert a.id in [x.id for x in listed.arrays]
    got = ok(array_get.sync_detailed(a.id, client=client), 200, ArrayView)
    assert (got.name, got.expires_at) == ("srs", a.expires_at)
    r = ok(msm.sync_detailed(client=client, body=MsmRequest(
        curve=Curve.BN254_G1, scalars=["2", "5"], points=ArrayRefDoc(array=a.id))), 200, MsmResponse)
    assert (int(r.result.x), int(r.result.y)) == BN254_2G
    data = ok(array_data.sync_detailed(a.id, client=client, encoding=Encoding.HEX), 200, ArrayDataResponse)
    assert data.points[1] is None and (data.points[0].x, data.points[0].y) == ("0x1", "0x2")
    # Field elements name any element operand.
    e = ok(array_create.sync_detailed(client=client, body=CreateArrayRequest(
        kind=ArrayKind.FIELD_ELEMENTS, field=Field.GOLDILOCKS, values=["3", "4"])), 201, ArrayView)
    r = ok(field_mul.sync_detailed(client=client, body=FieldBinaryRequest(
        field=Field.GOLDILOCKS, a=ArrayRefDoc(array=e.id), b=["5"])), 200, FieldVectorResponse)
    assert r.result == ["15", "20"]
    # A result kept without its values, named by the next op.
    r = ok(field_mul.sync_detailed(client=client, body=FieldBinaryRequest(
        field=Field.GOLDILOCKS, a=ArrayRefDoc(array=e.id), b=["2"], keep=Keep(with_data=False))),
        200, FieldVectorResponse)
    assert not r.result and isinstance(r.kept, ArrayView) and r.kept.length == 2
    r = ok(field_add.sync_detailed(client=client, body=FieldBinaryRequest(
        field=Field.GOLDILOCKS, a=ArrayRefDoc(array=r.kept.id), b=["1"])), 200, FieldVectorResponse)
    assert r.result == ["7", "9"]
    for x in (a, e):
        assert array_delete.sync_detailed(x.id, client=client).status_code == 204


def test_a_result_kept_on_the_emulated_device_stays_there_until_read(start_server, connect):
    """A result kept without its values on a device stays there (`held: ["device"]`): the
    next step runs where it is, and reading it brings it to the host and the disk."""
    flags = ("--backend", "auto", "--emulate-device", "--verify-fraction", "0")
    dev = connect(start_server(flags=flags).url)
    deadline = time.monotonic() + 120  # the emulated device's self-tests run first
    while health_ready.sync_detailed(client=dev).status_code != 200:
        assert time.monotonic() < deadline, "the emulated device did not become ready"
        time.sleep(0.2)
    x = [str(v) for v in [3, 1, 4, 1, 5, 9, 2, 6]]
    r = ok(ntt.sync_detailed(client=dev, body=NttRequest(
        field=Field.GOLDILOCKS, values=x, backend=BackendChoice.GPU, keep=Keep(with_data=False))),
        200, FieldVectorResponse)
    assert not r.result and r.kept.held == ["device"]
    back = ok(intt.sync_detailed(client=dev, body=NttRequest(
        field=Field.GOLDILOCKS, values=ArrayRefDoc(array=r.kept.id))), 200, FieldVectorResponse)
    assert back.result == x
    data = ok(array_data.sync_detailed(r.kept.id, client=dev), 200, ArrayDataResponse)
    assert data.values == transform(dev, ntt, Field.GOLDILOCKS, [int(v) for v in x])
    assert ok(array_get.sync_detailed(r.kept.id, client=dev), 200, ArrayView).held == ["host", "disk"]


@refusal("array_create", 422, "invalid_point", "/points/0")
def refuse_array_create(c: Ctx):  # (1, 3) is not on y² = x³ + 3
    body = CreateArrayRequest(kind=ArrayKind.POINTS, curve=Curve.BN254_G1, points=[AffinePointDoc(x="1", y="3")])
    return array_create.sync_detailed(client=c.client, body=body)


@refusal("array_list", 401, "unauthorized")
def refuse_array_list(c: Ctx):  # no API key
    return array_list.sync_detailed(client=c.anon)


@refusal("array_get", 404, "array_not_found")
def refuse_array_get(c: Ctx):
    return array_get.sync_detailed("arr_missing", client=c.client)


@refusal("array_data", 404, "array_not_found")
def refuse_array_data(c: Ctx):
    return array_data.sync_detailed("arr_missing", client=c.client)


@refusal("array_delete", 404, "array_not_found")
def refuse_array_delete(c: Ctx):
    return array_delete.sync_detailed("arr_missing", client=c.client)


# ---------------------------------------------------------------------------------------
# mpc: Shamir secret sharing.


def lagrange_at_zero(points, p: int) -> int:
    """The polynomial through (x, y) points at 0, mod p: the secrets' oracle."""
    total = 0
    for i, (xi, yi) in enumerate(points):
        num = den = 1
        for j, (xj, _) in enumerate(points):
            if j != i:
                num, den = num * xj % p, den * (xj - xi) % p
        total = (total + yi * num * pow(den, p - 2, p)) % p
    return total


def split_secrets(client, secrets, commitments=False) -> ShamirSplitResponse:
    body = ShamirSplitRequest(field=Field.BN254_FR, secrets=[str(v) for v in secrets],
                              threshold=2, share_count=3, commitments=commitments)
    return ok(shamir_split.sync_detailed(client=client, body=body), 200, ShamirSplitResponse)


def share_in(share) -> ShareIn:
    return ShareIn(x=share.x, values=share.values)


@roundtrip("shamir_split")
def test_shamir_split(client):
    r = split_secrets(client, [42, 7])
    assert (r.field, r.threshold, r.length, len(r.shares)) == (Field.BN254_FR, 2, 2, 3)
    assert [s.x for s in r.shares] == ["1", "2", "3"]
    for pick in ([0, 1], [2, 0]):
        for j, secret in enumerate([42, 7]):
            points = [(int(r.shares[i].x), int(r.shares[i].values[j])) for i in pick]
            assert lagrange_at_zero(points, BN254_R) == secret


@refusal("shamir_split", 422, "invalid_parameter", "/threshold")
def refuse_shamir_split(c: Ctx):  # one share alone would be the secret
    body = ShamirSplitRequest(field=Field.GOLDILOCKS, secrets=["1"], threshold=1, share_count=3)
    return shamir_split.sync_detailed(client=c.client, body=body)


@roundtrip("shamir_combine")
def test_shamir_combine(client):
    r = split_secrets(client, [5, 6, 7])
    body = ShamirCombineRequest(field=Field.BN254_FR, threshold=2,
                                shares=[share_in(r.shares[2]), share_in(r.shares[0]),
                                        share_in(r.shares[1])])
    out = ok(shamir_combine.sync_detailed(client=client, body=body), 200, ShamirCombineResponse)
    assert (out.secrets, out.shares_used, out.shares_checked) == (["5", "6", "7"], 2, 1)


@refusal("shamir_combine", 422, "insufficient_shares", "/shares")
def refuse_shamir_combine(c: Ctx):
    body = ShamirCombineRequest(field=Field.BN254_FR, threshold=2,
                                shares=[ShareIn(x="1", values=["9"])])
    return shamir_combine.sync_detailed(client=c.client, body=body)


@roundtrip("shamir_verify")
def test_shamir_verify(client):
    r = split_secrets(client, [11, 12], commitments=True)
    assert len(r.commitments.rows) == 2 and len(r.commitments.rows[0]) == 2
    for share in r.shares:
        body = ShamirVerifyRequest(field=Field.BN254_FR, share=share_in(share),
                                   commitments=r.commitments.rows)
        v = ok(shamir_verify.sync_detailed(client=client, body=body), 200, ShamirVerifyResponse)
        assert (v.valid, v.threshold, v.length) == (True, 2, 2)
    moved = ShareIn(x=r.shares[1].x, values=r.shares[0].values)
    body = ShamirVerifyRequest(field=Field.BN254_FR, share=moved, commitments=r.commitments.rows)
    v = ok(shamir_verify.sync_detailed(client=client, body=body), 200, ShamirVerifyResponse)
    assert v.valid is False


@refusal("shamir_verify", 422, "invalid_parameter", "/field")
def refuse_shamir_verify(c: Ctx):  # goldilocks has no commitment curve
    body = ShamirVerifyRequest(field=Field.GOLDILOCKS, share=ShareIn(x="1", values=["1"]),
                               commitments=[[None]])
    return shamir_verify.sync_detailed(client=c.client, body=body)


# ---------------------------------------------------------------------------------------
# secagg: secure-aggregation rounds (docs/SECAGG.md), driven by secagg_client.py, an
# independent Python client, through the generated operations.

SECAGG_CLIP = 1.5
SECAGG_SCALE_BITS = 16
SECAGG_TICK = 2.0**-SECAGG_SCALE_BITS


def secagg_inputs(clients: int, length: int, seed: int) -> list[list[float]]:
    """Values in ±2·clip (some clipped), and exact ties half a tick from a grid point, so
    that the rounding rule (half away from zero) shows in the sum."""
    rng = random.Random(seed)
    ties = [0.5 * SECAGG_TICK, -0.5 * SECAGG_TICK, 2.5 * SECAGG_TICK, -2.5 * SECAGG_TICK]
    out = []
    for i in range(clients):
        row = [rng.uniform(-2 * SECAGG_CLIP, 2 * SECAGG_CLIP) for _ in range(length)]
        row[i % length] = ties[i % len(ties)]
        row[(i + 1) % length] = SECAGG_CLIP * (1 if i % 2 else -1) * 1.25  # beyond the clip
        out.append(row)
    return out


def expected_sum(rows, clip: float, scale_bits: int) -> list[float]:
    """The docs' quantisation worked out in decimal arithmetic (not with secagg_client):
    clamp to ±clip, scale by 2^f, round half away from zero; summed; over 2^f."""
    with localcontext() as dec:
        dec.prec = 200
        scale = Decimal(2) ** scale_bits
        lo, hi = Decimal(-clip), Decimal(clip)

        def q(x: float) -> int:
            v = min(max(Decimal(x), lo), hi) * scale
            return int(v.quantize(Decimal(1), rounding=ROUND_HALF_UP))  # ties away from 0

        totals = [sum(q(row[i]) for row in rows) for i in range(len(rows[0]))]
    assert all(abs(t) < 2**31 for t in totals)
    return [t / 2**scale_bits for t in totals]


def round_info(view) -> sa.RoundInfo:
    return sa.RoundInfo.of(view)


def wait_aggregated(client, round_id: str, timeout_s: float = 30) -> RoundView:
    """Polls secagg_round_get while the round is aggregating (the sum is computed in the
    background after the last reveal)."""
    deadline = time.monotonic() + timeout_s
    while True:
        view = ok(secagg_round_get.sync_detailed(round_id, client=client), 200, RoundView)
        if view.stage != Stage.AGGREGATING:
            return view
        assert time.monotonic() < deadline, f"{round_id} still aggregating after {timeout_s} s"
        time.sleep(0.05)


@roundtrip("secagg_round_create", "secagg_round_get", "secagg_register", "secagg_shares",
           "secagg_inbox", "secagg_input", "secagg_round_advance", "secagg_unmask",
           "secagg_round_result")
def test_secagg_round_with_a_dropout(client):
    # Five clients, everyone each other's neighbour (k = 4), threshold 3; client 3 sends
    # its shares and then drops: the coordinator closes masked_input without it, and the
    # others reveal its mask_key shares so its pair masks come out of the sum.
    n, t, length, dropout = 5, 3, 16, 3
    inputs = secagg_inputs(n, length, seed=20261125)
    body = CreateRoundRequest(clients=n, threshold=t, vector_length=length, clip=SECAGG_CLIP,
                              scale_bits=SECAGG_SCALE_BITS)
    resp = secagg_round_create.sync_detailed(client=client, body=body)
    created = ok(resp, 201, CreateRoundResponse)
    rid, coordinator = created.id, created.coordinator_token
    assert rid.startswith("sar_") and len(rid) == 36 and resp.headers["location"] == f"/secagg/rounds/{rid}"
    assert (created.stage, created.clients, created.config.neighbours) == (Stage.ADVERTISE_KEYS, [], n - 1)
    assert (created.config.modulus_bits, len(bytes.fromhex(created.config.graph_seed))) == (32, 32)
    assert coordinator

    view = ok(secagg_round_get.sync_detailed(rid, client=client), 200, RoundView)
    assert (view.id, view.stage, view.config.threshold) == (rid, Stage.ADVERTISE_KEYS, t)

    # advertise_keys: ids 1..=n in order of registration; the last one closes the stage.
    parties = [sa.SecAggClient(rid) for _ in range(n)]
    for i, p in enumerate(parties):
        reg = ok(secagg_register.sync_detailed(
            rid, client=client, body=RegisterRequest.from_dict(p.register_body())), 201, RegisterResponse)
        p.registered(reg)
        assert p.id == i + 1 and p.token
        assert reg.round_.stage == (Stage.SHARE_KEYS if i == n - 1 else Stage.ADVERTISE_KEYS)
    info = round_info(reg.round_)

    # share_keys: sealed shares to every neighbour, and the commitment to β.
    for i, p in enumerate(parties):
        body = SharesRequest.from_dict(p.shares_body(info))
        sub = ok(secagg_shares.sync_detailed(rid, client=client, body=body, x_secagg_token=p.token),
                 200, SubmissionResponse)
        assert sub.client_id == p.id
        assert sub.round_.stage == (Stage.MASKED_INPUT if i == n - 1 else Stage.SHARE_KEYS)
        shown = {c.id: c for c in sub.round_.clients}[p.id]
        assert shown.shared and shown.self_mask_commitment == sa.b64(
            sa.self_mask_commitment(rid, p.id, p.beta))
    info = round_info(sub.round_)
    assert info.shared == set(range(1, n + 1))

    # masked_input: each survivor opens one message from every other client and uploads.
    survivors = [p for p in parties if p.id != dropout]
    for p in survivors:
        inbox = ok(secagg_inbox.sync_detailed(rid, client=client, x_secagg_token=p.token), 200,
                   InboxResponse)
        p.open_inbox(info, inbox)
        assert sorted(p.held) == [v for v in range(1, n + 1) if v != p.id]

    def upload(p):
        body = InputRequest.from_dict(p.input_body(info, inputs[p.id - 1]))
        return secagg_input.sync_detailed(rid, client=client, body=body, x_secagg_token=p.token)

    for p in survivors[:2]:
        assert ok(upload(p), 200, SubmissionResponse).round_.stage == Stage.MASKED_INPUT
    # Two uploads are fewer than the threshold: the coordinator cannot close the stage yet,
    # and nothing changes; a second upload of one client is refused.
    problem(secagg_round_advance.sync_detailed(rid, client=client, x_secagg_token=coordinator),
            409, "secagg_too_few_clients")
    problem(upload(survivors[0]), 409, "secagg_already_submitted")
    for p in survivors[2:]:
        assert ok(upload(p), 200, SubmissionResponse).round_.stage == Stage.MASKED_INPUT
    advanced = ok(secagg_round_advance.sync_detailed(rid, client=client, x_secagg_token=coordinator),
                  200, RoundView)
    assert advanced.stage == Stage.UNMASKING
    info = round_info(advanced)
    assert (info.shared, info.uploaded) == (set(range(1, n + 1)), {p.id for p in survivors})
    # The dropout is too late now.
    problem(secagg_input.sync_detailed(rid, client=client, x_secagg_token=parties[dropout - 1].token,
                                       body=InputRequest(masked=sa.words_to_b64([0] * length))),
            409, "secagg_wrong_stage")

    # unmasking: β shares of the survivors, σ shares of the dropout, never both.
    first = survivors[0]
    wrong = first.unmask_body(info)
    for i, s in enumerate(wrong["shares"]):
        if s["owner"] == dropout:  # its β share in place of its σ share
            s["secret"] = "self_mask"
            s["share"] = sa.b64(sa.scalar_bytes(first.held[dropout][1]))
            wrong_at = i
    problem(secagg_unmask.sync_detailed(rid, client=client, body=UnmaskRequest.from_dict(wrong),
                                        x_secagg_token=first.token),
            422, "invalid_parameter", f"/shares/{wrong_at}/secret")
    for i, p in enumerate(survivors):
        body = UnmaskRequest.from_dict(p.unmask_body(info))
        kinds = {s.owner: s.secret for s in body.shares}
        assert kinds == {v: (Secret.MASK_KEY if v == dropout else Secret.SELF_MASK)
                         for v in range(1, n + 1) if v != p.id}
        sub = ok(secagg_unmask.sync_detailed(rid, client=client, body=body, x_secagg_token=p.token),
                 200, SubmissionResponse)
        assert sub.client_id == p.id
        assert sub.round_.stage == (Stage.AGGREGATING if i == len(survivors) - 1 else Stage.UNMASKING)

    done = wait_aggregated(client, rid)
    assert done.stage == Stage.FINISHED, done.failure
    r = ok(secagg_round_result.sync_detailed(rid, client=client, x_secagg_token=coordinator), 200,
           RoundResult)
    want = expected_sum([inputs[p.id - 1] for p in survivors], SECAGG_CLIP, SECAGG_SCALE_BITS)
    assert (r.id, r.clients, r.dropped, r.scale_bits) == (
        rid, [p.id for p in survivors], [dropout], SECAGG_SCALE_BITS)
    assert r.sum_ == want  # exact: integers over 2^16
    assert sa.b64_to_words(r.ring_sum) == [round(v * 2**SECAGG_SCALE_BITS) % 2**32 for v in want]
    # The round has ended: nothing is left to close.
    problem(secagg_round_advance.sync_detailed(rid, client=client, x_secagg_token=coordinator),
            409, "secagg_wrong_stage")


def test_secagg_sparse_round_with_a_dropout(client):
    # SecAgg+: seven clients on a seeded ring, each joined to the 2 nearest on either side
    # (k = 4), threshold 3. The server accepts shares only for exactly the neighbours the
    # docs' graph gives, so a wrong permutation fails at the first secagg_shares.
    n, k, t, length = 7, 4, 3, 5
    inputs = secagg_inputs(n, length, seed=7)
    coord, parties, r = sa.run_round(client, inputs, threshold=t, neighbours=k, clip=SECAGG_CLIP,
                                     scale_bits=SECAGG_SCALE_BITS, drop_after_shares=[6])
    info = sa.fetch_round(client, coord.round_id)
    assert info.stage == "finished"
    for p in parties:
        assert len(info.neighbours_of(p.id)) == k
    assert (r.clients, r.dropped) == ([1, 2, 3, 4, 5, 7], [6])
    assert r.sum_ == expected_sum([inputs[i - 1] for i in r.clients], SECAGG_CLIP, SECAGG_SCALE_BITS)


@dataclass
class WaitingRound:
    """A round of three at advertise_keys with only client 1 registered: it stays there,
    so every refusal below finds it as it was."""

    coordinator: sa.Coordinator
    member: sa.SecAggClient


@pytest.fixture(scope="module")
def secagg_waiting(client) -> WaitingRound:
    coord = sa.Coordinator.create_via(client, clients=3, threshold=2, vector_length=4, clip=1.0)
    member = sa.SecAggClient(coord.round_id)
    member.register_via(client)
    return WaitingRound(coord, member)


@refusal("secagg_round_create", 422, "invalid_parameter", "/threshold")
def refuse_secagg_round_create(c: Ctx):  # four clients: three neighbours, so t ≤ 3
    body = CreateRoundRequest(clients=4, threshold=4, vector_length=4, clip=1.0)
    return secagg_round_create.sync_detailed(client=c.client, body=body)


@refusal("secagg_round_get", 404, "secagg_round_not_found")
def refuse_secagg_round_get(c: Ctx):
    return secagg_round_get.sync_detailed("sar_" + "0" * 32, client=c.client)


@refusal("secagg_round_advance", 409, "secagg_too_few_clients")
def refuse_secagg_round_advance(c: Ctx):  # one of three registered: no one to share with
    w = c.secagg
    return secagg_round_advance.sync_detailed(w.coordinator.round_id, client=c.client,
                                              x_secagg_token=w.coordinator.token)


@refusal("secagg_round_result", 409, "secagg_wrong_stage")
def refuse_secagg_round_result(c: Ctx):  # still at advertise_keys
    w = c.secagg
    return secagg_round_result.sync_detailed(w.coordinator.round_id, client=c.client,
                                             x_secagg_token=w.coordinator.token)


@refusal("secagg_register", 422, "invalid_parameter", "/mask_key")
def refuse_secagg_register(c: Ctx):  # a 31-byte key (the share key is a point of large order)
    body = RegisterRequest(share_key=sa.b64(bytes([9]) * 32), mask_key=sa.b64(bytes(31)))
    return secagg_register.sync_detailed(c.secagg.coordinator.round_id, client=c.client, body=body)


@refusal("secagg_shares", 409, "secagg_wrong_stage")
def refuse_secagg_shares(c: Ctx):  # the share stage has not opened
    w = c.secagg
    body = SharesRequest(self_mask_commitment=sa.b64(bytes(32)),
                         messages=[SealedShareIn(recipient=2, ciphertext=sa.b64(bytes(88)))])
    return secagg_shares.sync_detailed(w.coordinator.round_id, client=c.client, body=body,
                                       x_secagg_token=w.member.token)


@refusal("secagg_inbox", 403, "secagg_token_invalid")
def refuse_secagg_inbox(c: Ctx):  # the coordinator's token names no client
    w = c.secagg
    return secagg_inbox.sync_detailed(w.coordinator.round_id, client=c.client,
                                      x_secagg_token=w.coordinator.token)


@refusal("secagg_input", 404, "secagg_round_not_found")
def refuse_secagg_input(c: Ctx):
    body = InputRequest(masked=sa.words_to_b64([0, 0, 0, 0]))
    return secagg_input.sync_detailed("sar_" + "0" * 32, client=c.client, body=body,
                                      x_secagg_token=c.secagg.member.token)


@refusal("secagg_unmask", 422, "invalid_parameter", "/shares/0/share")
def refuse_secagg_unmask(c: Ctx):  # r itself is not a canonical scalar
    w = c.secagg
    share = RevealedShareIn(owner=2, secret=Secret.SELF_MASK, share=sa.b64(sa.R.to_bytes(32, "little")))
    return secagg_unmask.sync_detailed(w.coordinator.round_id, client=c.client,
                                       body=UnmaskRequest(shares=[share]), x_secagg_token=w.member.token)


# ---------------------------------------------------------------------------------------
# he: BFV ciphertext aggregation (the server under test is a dealer).

HE_T = 65537  # every set's plaintext modulus
HE_SET = ParameterSet.BFV128_N4096


@pytest.fixture(scope="module")
def he_keys_4096(client) -> HeKeysResponse:
    return ok(he_keys.sync_detailed(client=client, body=HeKeysRequest(parameters=HE_SET)),
              200, HeKeysResponse)


def he_encrypt_values(client, keys: HeKeysResponse, values: list[int]) -> str:
    body = HeEncryptRequest(parameters=HE_SET, public_key=keys.public_key, values=values)
    return ok(he_encrypt.sync_detailed(client=client, body=body), 200, HeCiphertextResponse).ciphertext


@roundtrip("he_keys")
def test_he_keys(he_keys_4096):
    k = he_keys_4096
    assert (k.parameters, k.slots, k.plaintext_modulus) == (HE_SET, 4096, HE_T)
    assert len(base64.b64decode(k.public_key)) > len(base64.b64decode(k.secret_key)) > 4096


@roundtrip("he_encrypt", "he_aggregate", "he_decrypt")
def test_he_weighted_sum_decrypts_to_the_slot_sums(client, he_keys_4096):
    rng = random.Random(20)
    rows = [[rng.randrange(HE_T) for _ in range(50)] for _ in range(3)]
    cts = [he_encrypt_values(client, he_keys_4096, row) for row in rows]
    weights = [1, 7, HE_T - 1]
    body = HeAggregateRequest(parameters=HE_SET, ciphertexts=cts, weights=weights)
    total = ok(he_aggregate.sync_detailed(client=client, body=body), 200, HeCiphertextResponse)
    assert total.parameters == HE_SET
    body = HeDecryptRequest(parameters=HE_SET, secret_key=he_keys_4096.secret_key,
                            ciphertext=total.ciphertext)
    out = ok(he_decrypt.sync_detailed(client=client, body=body), 200, HeDecryptResponse)
    want = [sum(w * row[i] for w, row in zip(weights, rows)) % HE_T for i in range(50)]
    assert out.values == want + [0] * (4096 - 50)


@refusal("he_keys", 403, "he_dealer_mode_off")
def refuse_he_keys(c: Ctx):
    return he_keys.sync_detailed(client=c.no_dealer, body=HeKeysRequest(parameters=HE_SET))


@refusal("he_encrypt", 422, "invalid_parameter", "/values/1")
def refuse_he_encrypt(c: Ctx):  # a slot value is taken mod t: HE_T itself is out of range
    body = HeEncryptRequest(parameters=HE_SET, public_key="AAAA", values=[1, HE_T])
    return he_encrypt.sync_detailed(client=c.client, body=body)


@refusal("he_aggregate", 422, "invalid_ciphertext", "/ciphertexts/0")
def refuse_he_aggregate(c: Ctx):  # three bytes are no ciphertext
    body = HeAggregateRequest(parameters=HE_SET, ciphertexts=["AAAA"])
    return he_aggregate.sync_detailed(client=c.client, body=body)


@refusal("he_decrypt", 403, "he_dealer_mode_off")
def refuse_he_decrypt(c: Ctx):
    body = HeDecryptRequest(parameters=HE_SET, secret_key="AAAA", ciphertext="AAAA")
    return he_decrypt.sync_detailed(client=c.no_dealer, body=body)


# ---------------------------------------------------------------------------------------
# dp: noise mechanisms, DP-SGD, accountant, budgets.


def assert_seeded_release(client, api, body, mechanism: str) -> MechanismResponse:
    """Two releases with the same seed: equal, of the input's length, with `mechanism`."""
    first = ok(api.sync_detailed(client=client, body=body), 200, MechanismResponse)
    again = ok(api.sync_detailed(client=client, body=body), 200, MechanismResponse)
    assert first.values == again.values
    assert len(first.values) == len(body.values)
    assert first.noise.mechanism == mechanism
    assert first.noise.scale > 0 and first.noise.grid > 0
    assert first.noise.sensitivity >= body.sensitivity
    assert 0 < first.epsilon <= body.epsilon  # never above the one asked
    return first


@roundtrip("dp_laplace")
def test_dp_laplace(client):
    body = LaplaceRequest(values=[1.0, 2.0, 3.0], sensitivity=1.0, epsilon=1.0, seed=42)
    assert_seeded_release(client, dp_laplace, body, "discrete_laplace")


@refusal("dp_laplace", 404, "budget_not_found", "/budget_id")
def refuse_dp_laplace(c: Ctx):
    body = LaplaceRequest(values=[1.0], sensitivity=1.0, epsilon=1.0, budget_id="bud_missing")
    return dp_laplace.sync_detailed(client=c.client, body=body)


@roundtrip("dp_gaussian")
def test_dp_gaussian(client):
    body = GaussianRequest(values=[1.0, 2.0, 3.0], sensitivity=1.0, epsilon=1.0, delta=1e-5,
                           seed=42)
    r = assert_seeded_release(client, dp_gaussian, body, "discrete_gaussian")
    assert r.delta == 1e-5


@refusal("dp_gaussian", 422, "invalid_parameter", "/delta")
def refuse_dp_gaussian(c: Ctx):
    body = GaussianRequest(values=[1.0], sensitivity=1.0, epsilon=1.0, delta=1.5)
    return dp_gaussian.sync_detailed(client=c.client, body=body)


@roundtrip("dp_privatize")
def test_dp_privatize(client):
    norms = [math.sqrt(5.25), 5.0]
    body = PrivatizeRequest(per_example_gradients=GRADIENTS, clip_norm=3.0,
                            noise_multiplier=1.1, seed=7)
    r = ok(dp_privatize.sync_detailed(client=client, body=body), 200, PrivatizeResponse)
    assert r.fraction_clipped == 0.5  # only the second row's norm exceeds 3
    assert r.max_norm == pytest.approx(max(norms))
    assert r.mean_norm == pytest.approx(sum(norms) / 2)
    assert len(r.gradient) == 3
    assert r.noise.mechanism == "discrete_gaussian"
    assert r.noise.scale == pytest.approx(1.1 * 3.0, rel=1e-3)  # σ·C
    assert r.effective_noise_multiplier == pytest.approx(1.1, rel=1e-3)
    again = ok(dp_privatize.sync_detailed(client=client, body=body), 200, PrivatizeResponse)
    assert again.gradient == r.gradient
    # Packed f32 in, packed f32 out.
    packed = Packed(encoding=BinaryEncoding.BASE64, dtype=Dtype.F32, shape=[2, 3],
                    data=f32_base64([v for row in GRADIENTS for v in row]))
    body = PrivatizeRequest(per_example_gradients=packed, clip_norm=1.0,
                            noise_multiplier=1.1, seed=7)
    r = ok(dp_privatize.sync_detailed(client=client, body=body), 200, PrivatizeResponse)
    assert isinstance(r.gradient, Packed), r.gradient
    assert (r.gradient.dtype, r.gradient.shape) == (Dtype.F32, [3])
    assert r.fraction_clipped == 1.0


@refusal("dp_privatize", 422, "invalid_tensor", "/per_example_gradients/1")
def refuse_dp_privatize(c: Ctx):  # ragged rows
    body = PrivatizeRequest(per_example_gradients=[[0.5, -1.0, 2.0], [3.0, 0.0]],
                            clip_norm=1.0, noise_multiplier=1.1)
    return dp_privatize.sync_detailed(client=c.client, body=body)


@roundtrip("dp_accountant_epsilon")
def test_dp_accountant_epsilon(client):
    body = EpsilonRequest(noise_multiplier=1.5, **ACCOUNTANT_CASE)
    r = ok(dp_accountant_epsilon.sync_detailed(client=client, body=body), 200, EpsilonResponse)
    assert r.epsilon == pytest.approx(ACCOUNTANT_EPSILON, rel=1e-9)
    assert r.optimal_order == 3.9


@refusal("dp_accountant_epsilon", 422, "invalid_parameter", "/delta")
def refuse_dp_accountant_epsilon(c: Ctx):
    body = EpsilonRequest(noise_multiplier=1.5, **dict(ACCOUNTANT_CASE, delta=2.0))
    return dp_accountant_epsilon.sync_detailed(client=c.client, body=body)


@roundtrip("dp_accountant_noise_multiplier")
def test_dp_accountant_noise_multiplier(client):
    body = NoiseMultiplierRequest(target_epsilon=ACCOUNTANT_EPSILON, **ACCOUNTANT_CASE)
    r = ok(dp_accountant_noise_multiplier.sync_detailed(client=client, body=body), 200,
           NoiseMultiplierResponse)
    assert r.noise_multiplier == pytest.approx(1.5, rel=1e-6)
    assert r.epsilon <= ACCOUNTANT_EPSILON * (1 + 1e-12)
    assert r.optimal_order == 3.9


@refusal("dp_accountant_noise_multiplier", 422, "invalid_parameter", "/target_epsilon")
def refuse_dp_accountant_noise_multiplier(c: Ctx):  # no σ up to 2e6 gets ε that low
    body = NoiseMultiplierRequest(target_epsilon=1e-9, **ACCOUNTANT_CASE)
    return dp_accountant_noise_multiplier.sync_detailed(client=c.client, body=body)


@roundtrip("dp_budget_create")
def test_dp_budget_create(budget):
    assert budget.id.startswith("bud_")
    assert (budget.name, budget.accountant, budget.epsilon_limit, budget.delta) == (
        "roundtrip", "rdp", 8.0, 1e-5)
    assert (budget.epsilon_spent, budget.epsilon_remaining, budget.charges) == (0.0, 8.0, 0)


@refusal("dp_budget_create", 422, "invalid_parameter", "/epsilon_limit")
def refuse_dp_budget_create(c: Ctx):
    body = CreateBudgetRequest(epsilon_limit=-1.0, delta=1e-5)
    return dp_budget_create.sync_detailed(client=c.client, body=body)


@roundtrip("dp_budget_get")
def test_dp_budget_get(client, budget):
    fresh = ok(dp_budget_get.sync_detailed(budget.id, client=client), 200, BudgetDetail)
    assert (fresh.id, fresh.epsilon_spent, fresh.epsilon_remaining, fresh.history) == (
        budget.id, 0.0, 8.0, [])
    # A release charged to it shows in the release's privacy report and in the history.
    body = LaplaceRequest(values=[1.0], sensitivity=1.0, epsilon=0.5, budget_id=budget.id)
    release = ok(dp_laplace.sync_detailed(client=client, body=body), 200, MechanismResponse)
    assert isinstance(release.privacy, PrivacyReport), release
    assert (release.privacy.budget_id, release.privacy.charge_seq) == (budget.id, 1)
    spent = release.privacy.epsilon_spent
    assert 0 < spent <= 0.5
    charged = ok(dp_budget_get.sync_detailed(budget.id, client=client, history_limit=10), 200,
                 BudgetDetail)
    assert (charged.charges, charged.epsilon_spent) == (1, spent)
    assert charged.epsilon_remaining == pytest.approx(8.0 - spent)
    assert [(h.seq, h.kind, h.status) for h in charged.history] == [(1, "laplace", "charged")]


@refusal("dp_budget_get", 404, "budget_not_found")
def refuse_dp_budget_get(c: Ctx):
    return dp_budget_get.sync_detailed("bud_missing", client=c.client)


@roundtrip("dp_budget_list")
def test_dp_budget_list(client, budget):
    r = ok(dp_budget_list.sync_detailed(client=client), 200, BudgetList)
    listed = {b.id: b for b in r.budgets}
    assert budget.id in listed
    assert listed[budget.id].epsilon_limit == 8.0


@refusal("dp_budget_list", 401, "unauthorized")
def refuse_dp_budget_list(c: Ctx):  # no API key
    return dp_budget_list.sync_detailed(client=c.anon)


# ---------------------------------------------------------------------------------------
# rf: features of an uploaded recording.


@roundtrip("rf_features")
def test_rf_features(client):
    # A unit tone at +10 kHz, 200 kHz, 4096 samples: one chunk (shorter than 200 ms) of
    # eight 512-point Welch segments (docs/RF_FEATURES.md); |x|² = 1 mW is 0 dBm.
    body = RfFeaturesRequest(sample_rate_hz=200_000.0, iq=tone_iq(10_000.0, 200_000.0, 4096),
                             encoding=BinaryEncoding.BASE64, per_chunk=True)
    r = ok(rf_features.sync_detailed(client=client, body=body), 200, RfFeaturesResponse)
    assert (r.samples, r.chunks, r.samples_per_chunk, r.fft_size, r.segments_per_chunk) == (
        4096, 1, 4096, 512, 8)
    f = r.features
    assert f.frequency_offset_hz.mean == pytest.approx(10_000.0, abs=5.0)
    assert f.spectral_centroid_hz.mean == pytest.approx(10_000.0, abs=5.0)
    assert f.rssi_dbm.mean == pytest.approx(0.0, abs=1e-3)
    assert f.envelope_mean.mean == pytest.approx(1.0, abs=1e-4)
    assert f.peak_to_avg_ratio_db.mean == pytest.approx(0.0, abs=1e-3)
    assert f.signal_present.mean == 1.0
    assert f.snr_db.mean > 60
    assert f.bandwidth_hz.mean <= 4 * 200_000 / 512  # a tone: at most four bins
    assert len(r.per_chunk) == 1
    assert r.per_chunk[0].frequency_offset_hz == pytest.approx(10_000.0, abs=5.0)


@refusal("rf_features", 422, "invalid_parameter", "/iq")
def refuse_rf_features(c: Ctx):  # 100 samples make no chunk of 128
    body = RfFeaturesRequest(sample_rate_hz=200_000.0, iq=tone_iq(1_000.0, 200_000.0, 100),
                             encoding=BinaryEncoding.BASE64)
    return rf_features.sync_detailed(client=c.client, body=body)


@roundtrip("rf_iq")
def test_rf_iq(client):
    # Two receivers, 5 ms at 200 kHz: 1000 complex samples each, with SigMF metadata.
    config = Scenario(signal=Signal(duration_ms=5.0), chunk_ms=5.0,
                      geometry=Geometry(receivers_min=2, receivers_max=2))
    body = RfIqRequest(config=config, seed=7, sample_index=3, format_=RecordingFormat.SIGMF)
    r = ok(rf_iq.sync_detailed(client=client, body=body), 200, RfIqResponse)
    assert (r.seed, r.sample_index, r.samples_per_recording, r.sample_rate_hz) == (
        7, 3, 1000, 200_000.0)
    assert len(r.receivers) == 2
    for n, rec in enumerate(r.receivers):
        data = base64.b64decode(rec.iq)
        assert len(data) == 8 * 1000
        values = struct.unpack(f"<{2 * 1000}f", data)
        assert all(math.isfinite(v) for v in values) and any(v != 0.0 for v in values)
        meta = rec.sigmf_meta.to_dict()["global"]
        assert meta["core:sha512"] == hashlib.sha512(data).hexdigest()
        assert meta["gpu_ops:receiver"] == n and meta["gpu_ops:sample_index"] == 3
        assert meta["gpu_ops:receiver_truth"]["distance_m"] == rec.truth.distance_m
    # The same request gives the same recordings.
    again = ok(rf_iq.sync_detailed(client=client, body=body), 200, RfIqResponse)
    assert [x.iq for x in again.receivers] == [x.iq for x in r.receivers]


@refusal("rf_iq", 422, "invalid_parameter", "/config/signal/duration_ms")
def refuse_rf_iq(c: Ctx):  # a negative recording length
    body = RfIqRequest(config=Scenario(signal=Signal(duration_ms=-1.0)), seed=1)
    return rf_iq.sync_detailed(client=c.client, body=body)


# ---------------------------------------------------------------------------------------
# linalg: batched matrix multiply.


@roundtrip("matmul")
def test_matmul(client):
    # A batch of two against a broadcast B, nested numbers in and out.
    body = MatmulRequest(a=[[[1.0, 2.0], [3.0, 4.0]], [[0.0, 1.0], [1.0, 0.0]]],
                         b=[[5.0, 6.0], [7.0, 8.0]], alpha=0.5)
    r = ok(matmul.sync_detailed(client=client, body=body), 200, MatmulResponse)
    assert r.shape == [2, 2, 2]
    assert r.result == [[[9.5, 11.0], [21.5, 25.0]], [[3.5, 4.0], [2.5, 3.0]]]
    assert r.flops == 32.0 and r.gflops_per_second >= 0.0


def test_matmul_every_transpose_is_the_naive_product(client):
    # op(A)·op(B) for each transpose pair, 3×4 by 4×2, held to a triple loop over explicit
    # indices; small integers, so f32 is exact and any wrong index shows.
    m, k, n = 3, 4, 2

    def matrix(salt, rows, cols):
        return [[float((r * 7 + c * 3 + salt * 5) % 11 - 5) for c in range(cols)]
                for r in range(rows)]

    def op(x, transposed, r, c):
        return x[c][r] if transposed else x[r][c]

    for ta in (False, True):
        for tb in (False, True):
            a = matrix(1, k, m) if ta else matrix(1, m, k)
            b = matrix(2, n, k) if tb else matrix(2, k, n)
            body = MatmulRequest(a=a, b=b, transpose_a=ta, transpose_b=tb)
            r = ok(matmul.sync_detailed(client=client, body=body), 200, MatmulResponse)
            want = [[sum(op(a, ta, i, p) * op(b, tb, p, j) for p in range(k)) for j in range(n)]
                    for i in range(m)]
            assert r.shape == [m, n], (ta, tb)
            assert r.result == want, (ta, tb, r.result)


@refusal("matmul", 422, "invalid_tensor", "/b/shape")
def refuse_matmul(c: Ctx):  # op(A) is 1 × 2, op(B) 3 × 1: the inner dimensions differ
    body = MatmulRequest(a=[[1.0, 2.0]], b=[[1.0], [2.0], [3.0]])
    return matmul.sync_detailed(client=c.client, body=body)


# ---------------------------------------------------------------------------------------
# embeddings: sinusoidal position embeddings.


@roundtrip("embeddings_sinusoidal")
def test_embeddings_sinusoidal(client):
    body = SinusoidalRequest(dim=4, positions=[[0, 2]])
    r = ok(embeddings_sinusoidal.sync_detailed(client=client, body=body), 200, SinusoidalResponse)
    assert r.shape == [1, 2, 4]
    want = [math.sin(2.0), math.cos(2.0), math.sin(0.02), math.cos(0.02)]
    assert r.result[0][0] == [0.0, 1.0, 0.0, 1.0]
    assert r.result[0][1] == pytest.approx(want, rel=2**-24)


@refusal("embeddings_sinusoidal", 422, "invalid_parameter", "/dim")
def refuse_embeddings_sinusoidal(c: Ctx):  # dim must be even
    body = SinusoidalRequest(dim=3, num_positions=2)
    return embeddings_sinusoidal.sync_detailed(client=c.client, body=body)


@roundtrip("embedding_table_create", "embedding_table_get", "embedding_table_list",
           "embedding_table_lookup", "embedding_table_delete")
def test_embedding_tables(client):
    # Keep a 3 × 2 table, find it listed, look rows up, delete it.
    body = CreateTableRequest(table=[[0.5, 1.5], [2.5, 3.5], [4.5, 5.5]], name="roundtrip")
    t = ok(embedding_table_create.sync_detailed(client=client, body=body), 201, TableView)
    assert (t.vocab, t.dim, t.size_bytes, t.name) == (3, 2, 24, "roundtrip")
    assert t.lookup_url == f"/embeddings/tables/{t.id}/lookup"
    listed = ok(embedding_table_list.sync_detailed(client=client), 200, TableList)
    assert t.id in [x.id for x in listed.tables]
    got = ok(embedding_table_get.sync_detailed(t.id, client=client), 200, TableView)
    assert got.vocab == 3
    rows = ok(embedding_table_lookup.sync_detailed(
        t.id, client=client, body=LookupRequest(ids=[[2, 0]], out_dtype=EmbeddingDtype.F16)), 200, LookupResponse)
    assert rows.shape == [1, 2, 2] and rows.result == [[[4.5, 5.5], [0.5, 1.5]]]
    r = embedding_table_delete.sync_detailed(t.id, client=client)
    assert r.status_code == 204


@refusal("embedding_table_create", 422, "invalid_tensor", "/table")
def refuse_embedding_table_create(c: Ctx):  # a value beyond f32's range
    return embedding_table_create.sync_detailed(client=c.client, body=CreateTableRequest(table=[[1e300]]))


@refusal("embedding_table_list", 401, "unauthorized")
def refuse_embedding_table_list(c: Ctx):  # no API key
    return embedding_table_list.sync_detailed(client=c.anon)


@refusal("embedding_table_get", 404, "embedding_table_not_found")
def refuse_embedding_table_get(c: Ctx):
    return embedding_table_get.sync_detailed("emb_missing", client=c.client)


@refusal("embedding_table_lookup", 404, "embedding_table_not_found")
def refuse_embedding_table_lookup(c: Ctx):
    return embedding_table_lookup.sync_detailed("emb_missing", client=c.client, body=LookupRequest(ids=[0]))


@refusal("embedding_table_delete", 404, "embedding_table_not_found")
def refuse_embedding_table_delete(c: Ctx):
    return embedding_table_delete.sync_detailed("emb_missing", client=c.client)


# ---------------------------------------------------------------------------------------
# nn: fused attention.


@roundtrip("attention")
def test_attention(client):
    # One query sees two keys of equal logit (the causal mask hides the third): the mean
    # of their values; the weights say so.
    body = AttentionRequest(q=[[[[0.0, 0.0], [1.0, 0.0]]]], k=[[[[1.0, 0.0], [1.0, 0.0], [0.0, 5.0]]]],
                            v=[[[[2.0], [4.0], [100.0]]]], causal=True, return_weights=True)
    r = ok(attention.sync_detailed(client=client, body=body), 200, AttentionResponse)
    assert r.shape == [1, 1, 2, 1]
    assert r.output[0][0][0] == [3.0]
    assert r.weights[0][0][0] == [0.5, 0.5, 0.0]
    assert r.flops == 2 * 2 * 3 * 3 and r.gflops_per_second >= 0.0


@refusal("attention", 422, "invalid_tensor", "/v/shape")
def refuse_attention(c: Ctx):  # two values for three keys
    body = AttentionRequest(q=[[[[1.0]]]], k=[[[[1.0], [2.0], [3.0]]]], v=[[[[1.0], [2.0]]]])
    return attention.sync_detailed(client=c.client, body=body)


@roundtrip("conv2d")
def test_conv2d(client):
    # A 2 × 2 box filter over a 3 × 3 image: sums of each 2 × 2 window, plus the bias.
    body = Conv2DRequest(input_=[[[[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]]]],
                         weight=[[[[1.0, 1.0], [1.0, 1.0]]]], bias=[0.5])
    r = ok(conv2d.sync_detailed(client=client, body=body), 200, Conv2DResponse)
    assert r.shape == [1, 1, 2, 2]
    assert r.result == [[[[12.5, 16.5], [24.5, 28.5]]]]
    assert r.flops == 2 * 4 * 4 and r.gflops_per_second >= 0.0


@refusal("conv2d", 422, "invalid_parameter", "/groups")
def refuse_conv2d(c: Ctx):  # two groups of one channel
    body = Conv2DRequest(input_=[[[[1.0]]]], weight=[[[[1.0]]]], groups=2)
    return conv2d.sync_detailed(client=c.client, body=body)


# ---------------------------------------------------------------------------------------
# beams: multipath channels and beam sweeps.


@roundtrip("beam_channels")
def test_beam_channels(client):
    # One path: every entry of H is its gain turned by a phase, so all have |α|.
    model = ChannelModel(batch=2, tx_array=ArrayGeometry(columns=4), rx_array=ArrayGeometry(columns=2),
                         paths=1, seed=3)
    body = ChannelsRequest(model=model, return_paths=True, out_dtype=BeamDtype.F64)
    r = ok(beam_channels.sync_detailed(client=client, body=body), 200, ChannelsResponse)
    assert r.shape == [2, 2, 4, 2] and r.seed == 3
    for b in range(2):
        modulus = math.hypot(*r.paths.gain[b][0])
        for row in r.channels[b]:
            for value in row:
                assert abs(math.hypot(*value) - modulus) < 1e-12


@refusal("beam_channels", 422, "invalid_parameter", "/model/paths")
def refuse_beam_channels(c: Ctx):  # 65 paths
    model = ChannelModel(batch=1, tx_array=ArrayGeometry(columns=2), rx_array=ArrayGeometry(columns=2),
                         paths=65)
    return beam_channels.sync_detailed(client=c.client, body=ChannelsRequest(model=model))


@roundtrip("beam_sweep")
def test_beam_sweep(client):
    # A channel of ones is broadside at both ends: the DFT beams at h = 0 (index K/2) win
    # with the whole array gain N_r·N_t = 8.
    body = SweepRequest(channels=[[[[1.0, 0.0]] * 4] * 2], tx_codebook=CodebookSpec(oversampling=2),
                        return_grid=True)
    r = ok(beam_sweep.sync_detailed(client=client, body=body), 200, SweepResponse)
    assert (r.best.rx, r.best.tx) == ([1], [4])
    assert abs(r.best.power[0] - 8.0) < 1e-5
    assert (r.rx_beams, r.tx_beams) == (2, 8) and len(r.grid[0]) == 2


@refusal("beam_sweep", 422, "invalid_parameter", "/model")
def refuse_beam_sweep(c: Ctx):  # neither a model nor channels
    return beam_sweep.sync_detailed(client=c.client, body=SweepRequest())


# ---------------------------------------------------------------------------------------
# datasets: synthetic dataset jobs and their files.


@roundtrip("dataset_create")
def test_dataset_create(iq_dataset):
    v = iq_dataset.created
    assert v.id.startswith("ds_")
    assert (v.name, v.dataset_type, v.num_samples, v.seed) == (
        "roundtrip", DatasetType.IQ_RAW, 2, 1)
    assert v.status in {DatasetStatus.QUEUED, DatasetStatus.RUNNING}
    assert v.status_url == iq_dataset.location == f"/datasets/{v.id}"
    assert (v.progress.valid, v.progress.target) == (0, 2)


@refusal("dataset_create", 422, "invalid_parameter", "/num_samples")
def refuse_dataset_create(c: Ctx):
    body = dataset_request("empty", 0, DatasetType.FEATURE_BASED)
    return dataset_create.sync_detailed(client=c.client, body=body)


@roundtrip("dataset_get")
def test_dataset_get(iq_dataset):
    v = iq_dataset.done  # fetched by dataset_get in the fixture
    assert (v.id, v.status) == (iq_dataset.created.id, DatasetStatus.COMPLETED)
    assert (v.progress.valid, v.progress.attempted, v.progress.target) == (2, 2, 2)
    assert v.features_url == f"/datasets/{v.id}/features"
    assert v.iq_url == f"/datasets/{v.id}/samples/{{n}}/iq/{{rx}}"
    assert v.finished_at


@refusal("dataset_get", 404, "dataset_not_found")
def refuse_dataset_get(c: Ctx):
    return dataset_get.sync_detailed("ds_missing", client=c.client)


@roundtrip("dataset_list")
def test_dataset_list(client, iq_dataset):
    r = ok(dataset_list.sync_detailed(client=client), 200, DatasetList)
    listed = {d.id: d for d in r.datasets}
    assert listed[iq_dataset.done.id].status == DatasetStatus.COMPLETED


@refusal("dataset_list", 401, "unauthorized")
def refuse_dataset_list(c: Ctx):  # no API key
    return dataset_list.sync_detailed(client=c.anon)


@roundtrip("dataset_events")
def test_dataset_events(client, iq_dataset):
    # A completed job's stream is one `end` event carrying its final DatasetView.
    resp = dataset_events.sync_detailed(iq_dataset.done.id, client=client)
    assert resp.status_code == 200, explain(resp)
    assert resp.headers["content-type"].startswith("text/event-stream")
    text = resp.content.decode()
    events = [block for block in text.split("\n\n") if block.strip()]
    assert len(events) == 1 and events[0].startswith("event: end\n"), text
    data = "".join(line[len("data:"):].strip() for line in events[0].splitlines()
                   if line.startswith("data:"))
    view = DatasetView.from_dict(json.loads(data))
    assert (view.id, view.status) == (iq_dataset.done.id, DatasetStatus.COMPLETED)
    # README: "dataset_events comes back as the raw text/event-stream text".
    assert isinstance(resp.parsed, str), (
        f"the generated dataset_events parses the stream as {resp.parsed!r}, not its text"
    )


@refusal("dataset_events", 404, "dataset_not_found")
def refuse_dataset_events(c: Ctx):
    return dataset_events.sync_detailed("ds_missing", client=c.client)


@roundtrip("dataset_features")
def test_dataset_features(client, iq_dataset):
    resp = dataset_features.sync_detailed(iq_dataset.done.id, client=client)
    f = ok(resp, 200, File)
    assert resp.headers["content-type"] == "application/vnd.apache.parquet"
    table = pq.read_table(io.BytesIO(f.payload.read()))
    assert table.num_rows == 2
    assert "sample_index" in table.column_names
    assert b"gpu_ops.generator_version" in table.schema.metadata


@refusal("dataset_features", 404, "dataset_not_found")
def refuse_dataset_features(c: Ctx):
    return dataset_features.sync_detailed("ds_missing", client=c.client)


def sigmf_meta(parsed) -> dict:
    """The SigMF metadata of a format=meta answer. The spec lists the archive's media type
    first, so the generated client hands every format back as a file (here, JSON bytes)."""
    assert isinstance(parsed, File), parsed
    return json.loads(parsed.payload.read())


@roundtrip("dataset_sample_iq")
def test_dataset_sample_iq_meta(client, iq_dataset):
    resp = sample_iq(client, iq_dataset.done.id, DatasetSampleIqFormat.META)
    assert resp.status_code == 200, explain(resp)
    assert resp.headers["content-type"] == "application/json"
    meta = sigmf_meta(resp.parsed)
    glob = meta["global"]
    assert (glob["core:version"], glob["core:datatype"], glob["core:sample_rate"]) == (
        "1.2.0", "cf32_le", 200_000.0)
    assert glob["gpu_ops:dataset_id"] == iq_dataset.done.id
    assert meta["captures"] and meta["captures"][0]["core:sample_start"] == 0


def test_dataset_sample_iq_data(client, iq_dataset):
    file = ok(sample_iq(client, iq_dataset.done.id, DatasetSampleIqFormat.DATA), 200, File)
    data = file.payload.read()
    assert len(data) == 100 * 200 * 8  # 100 ms at 200 kHz, cf32_le: 8 bytes a sample
    meta = sigmf_meta(sample_iq(client, iq_dataset.done.id, DatasetSampleIqFormat.META).parsed)
    assert hashlib.sha512(data).hexdigest() == meta["global"]["core:sha512"]


def test_dataset_sample_iq_archive(client, iq_dataset):
    archive = ok(sample_iq(client, iq_dataset.done.id, None), 200, File)  # the default
    with tarfile.open(fileobj=io.BytesIO(archive.payload.read())) as tar:
        files = {m.name.rsplit(".", 1)[-1]: tar.extractfile(m).read()
                 for m in tar.getmembers() if m.isfile()}
    assert set(files) == {"sigmf-meta", "sigmf-data"}
    assert json.loads(files["sigmf-meta"])["global"]["core:datatype"] == "cf32_le"
    assert len(files["sigmf-data"]) % 8 == 0


@refusal("dataset_sample_iq", 404, "sample_not_found")
def refuse_dataset_sample_iq(c: Ctx):  # row 5 of a two-row dataset
    return dataset_sample_iq.sync_detailed(c.dataset, 5, 0, client=c.client)


@roundtrip("dataset_cancel")
def test_dataset_cancel(client):
    job = create_dataset(client, long_dataset_request("cancelled"))
    r = ok(dataset_cancel.sync_detailed(job.id, client=client), 202, DatasetView)
    assert r.id == job.id
    view = wait_for(client, job.id, TERMINAL, timeout_s=60)
    assert view.status == DatasetStatus.CANCELLED, view
    problem(dataset_features.sync_detailed(job.id, client=client), 409, "dataset_not_ready")
    assert dataset_delete.sync_detailed(job.id, client=client).status_code == 204


@refusal("dataset_cancel", 409, "dataset_finished")
def refuse_dataset_cancel(c: Ctx):  # the job has completed
    return dataset_cancel.sync_detailed(c.dataset, client=c.client)


@roundtrip("dataset_resume")
def test_dataset_resume(interrupted):
    assert interrupted.view.status == DatasetStatus.INTERRUPTED, interrupted.view
    job_id = interrupted.view.id
    r = ok(dataset_resume.sync_detailed(job_id, client=interrupted.client), 202, DatasetView)
    assert r.id == job_id
    assert r.status in {DatasetStatus.QUEUED, DatasetStatus.RUNNING}
    # Resumed once, it is no longer interrupted.
    problem(dataset_resume.sync_detailed(job_id, client=interrupted.client), 409,
            "dataset_not_resumable")
    # Minutes of work left: stop it, so it does not hold the CPU the other tests share.
    ok(dataset_cancel.sync_detailed(job_id, client=interrupted.client), 202, DatasetView)
    assert wait_for(interrupted.client, job_id, TERMINAL).status == DatasetStatus.CANCELLED


def test_an_interrupted_dataset_says_how_to_resume(interrupted):
    # README: resume continues "an interrupted job (the server stopped or crashed)".
    assert "resume" in (interrupted.view.error or ""), interrupted.view.error


@refusal("dataset_resume", 409, "dataset_not_resumable")
def refuse_dataset_resume(c: Ctx):  # the job has completed, not been interrupted
    return dataset_resume.sync_detailed(c.dataset, client=c.client)


@roundtrip("dataset_delete")
def test_dataset_delete(client):
    job = create_dataset(client, dataset_request("deleted", 1, DatasetType.FEATURE_BASED))
    wait_completed(client, job.id)
    resp = dataset_delete.sync_detailed(job.id, client=client)
    assert resp.status_code == 204, explain(resp)
    assert resp.content == b""
    problem(dataset_get.sync_detailed(job.id, client=client), 404, "dataset_not_found")


@refusal("dataset_delete", 404, "dataset_not_found")
def refuse_dataset_delete(c: Ctx):
    return dataset_delete.sync_detailed("ds_missing", client=c.client)


# ---------------------------------------------------------------------------------------
# system: open routes, called without a key.


@roundtrip("health_live")
def test_health_live(anon):
    assert ok(health_live.sync_detailed(client=anon), 200, HealthStatus).status == "live"


@roundtrip("health_ready")
def test_health_ready(anon):
    assert ok(health_ready.sync_detailed(client=anon), 200, HealthStatus).status == "ready"


@roundtrip("device_info")
def test_device_info(anon):
    r = ok(device_info.sync_detailed(client=anon), 200, DeviceReport)
    assert (r.backend, r.mode, r.gpus) == (BackendKind.CPU, BackendChoice.CPU, [])
    assert r.cpu.threads == 1  # --cpu-threads 1
    assert "--backend cpu" in r.reason


@roundtrip("device_bandwidth")
def test_device_bandwidth(anon):
    # No device: host memory only, measured once and then cached.
    r = ok(device_bandwidth.sync_detailed(client=anon), 200, BandwidthReport)
    assert r.gpus == [] and r.host_memcpy_gb_per_s > 0 and r.host_bytes == 64 << 20
    again = ok(device_bandwidth.sync_detailed(client=anon), 200, BandwidthReport)
    assert (again.measured_at, again.host_memcpy_gb_per_s) == (r.measured_at, r.host_memcpy_gb_per_s)


@roundtrip("device_batch_hint")
def test_device_batch_hint(anon):
    # No device: the CPU, and 64³ products of 48 KiB of f32 each, three times over there.
    r = ok(device_batch_hint.sync_detailed(client=anon, op=HintOp.MATMUL, shape="64,64,64"), 200, BatchHint)
    assert r.device == "cpu" and r.shape == [64, 64, 64]
    assert r.bytes_per_item == 3 * 3 * 4096 * 4
    assert r.batch == min(r.fits, r.max_per_request) and r.batch > 0


@refusal("device_batch_hint", 422, "invalid_parameter", "/shape")
def refuse_device_batch_hint(c: Ctx):  # matmul takes three dimensions
    return device_batch_hint.sync_detailed(client=c.anon, op=HintOp.MATMUL, shape="64,64")


@roundtrip("metrics")
def test_metrics(anon):
    health_live.sync_detailed(client=anon)
    text = ok(metrics.sync_detailed(client=anon), 200, str)
    assert "# TYPE gpu_ops_http_requests_total counter" in text
    assert 'route="/health/live"' in text


# ---------------------------------------------------------------------------------------
# Refusals, and the coverage of both.


@pytest.mark.parametrize("case", REFUSALS, ids=lambda case: case.op)
def test_refusal(case: Refusal, ctx: Ctx):
    problem(case.call(ctx), case.status, case.code, case.path)


def test_every_operation_has_a_roundtrip(spec):
    operations = {
        op["operationId"]
        for item in spec["paths"].values()
        for op in item.values()
        if isinstance(op, dict) and "operationId" in op
    }
    refused = {case.op for case in REFUSALS}
    assert len(refused) == len(REFUSALS), "one refusal per operation"
    assert not refused & NO_REFUSAL, "an operation with a refusal is not in NO_REFUSAL"
    assert SUCCESS == operations, (
        f"without a success test: {sorted(operations - SUCCESS)}; "
        f"not in the spec: {sorted(SUCCESS - operations)}"
    )
    assert refused | NO_REFUSAL == operations, (
        f"without a refusal: {sorted(operations - refused - NO_REFUSAL)}; "
        f"not in the spec: {sorted((refused | NO_REFUSAL) - operations)}"
    )
