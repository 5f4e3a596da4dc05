"""Element sizes and array bytes agree with jax and numpy on every dtype."""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from meshplan.pure import MeshplanTypeError
from meshplan.pure.specs._dtypes import array_bytes, canonical_dtype, dtype_bits, dtype_storage_bytes

# Every dtype the CPU backend can hold (float6 types exist in ml_dtypes but
# XLA:CPU rejects them, so they are checked against jax.dtypes only).
LIVE_DTYPES = [
    np.bool_, np.int8, np.int16, np.int32, np.uint8, np.uint16, np.uint32, np.float16, np.float32,
    np.complex64, jnp.bfloat16, jnp.int4, jnp.uint4, jnp.int2, jnp.uint2, jnp.float4_e2m1fn,
    jnp.float8_e4m3fn, jnp.float8_e5m2, jnp.float8_e4m3fnuz, jnp.float8_e5m2fnuz, jnp.float8_e8m0fnu,
    jnp.float8_e3m4, jnp.float8_e4m3,
]
ALL_DTYPES = LIVE_DTYPES + [np.int64, np.uint64, np.float64, np.complex128,
                            ml_dtypes.float6_e2m3fn, ml_dtypes.float6_e3m2fn, ml_dtypes.int1]


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=lambda d: np.dtype(d).name)
def test_dtype_bits_agrees_with_jax_itemsize_bits(dtype):
    assert dtype_bits(dtype) == jax.dtypes.itemsize_bits(np.dtype(dtype))


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=lambda d: np.dtype(d).name)
def test_storage_bytes_is_numpy_itemsize(dtype):
    assert dtype_storage_bytes(dtype) == np.dtype(dtype).itemsize


@pytest.mark.parametrize("dtype", LIVE_DTYPES, ids=lambda d: np.dtype(d).name)
def test_array_bytes_equals_live_nbytes_and_device_size(dtype):
    x = jnp.zeros((3, 5), dtype)
    assert array_bytes(x.shape, x.dtype) == x.nbytes == x.on_device_size_in_bytes()
    assert array_bytes(x.shape, x.dtype) == x.addressable_shards[0].data.nbytes


def test_prng_key_arrays_count_their_key_data():
    keys = jax.random.split(jax.random.key(0), 6)
    assert dtype_bits(keys.dtype) == 64
    assert array_bytes(keys.shape, keys.dtype) == jax.random.key_data(keys).nbytes == keys.nbytes


def test_float0_arrays_take_no_bytes():
    assert array_bytes((7, 3), jax.dtypes.float0) == np.zeros((7, 3), jax.dtypes.float0).nbytes == 0


@given(
    shape=st.lists(st.integers(0, 9), max_size=4).map(tuple),
    dtype=st.sampled_from(ALL_DTYPES),
)
def test_packed_count_is_ceil_of_bits_and_never_above_unpacked(shape, dtype):
    n = int(np.prod(shape, dtype=np.int64))
    packed = array_bytes(shape, dtype, packed_subbyte=True)
    unpacked = array_bytes(shape, dtype)
    assert unpacked == n * np.dtype(dtype).itemsize
    assert packed == -(-n * dtype_bits(dtype) // 8)
    assert packed <= unpacked
    if dtype_bits(dtype) >= 8:
        assert packed == unpacked


def test_canonical_dtype_accepts_names_types_and_dtypes():
    assert canonical_dtype("bfloat16") == canonical_dtype(jnp.bfloat16) == np.dtype(ml_dtypes.bfloat16)
    key_dtype = jax.random.key(0).dtype
    assert canonical_dtype(key_dtype) is key_dtype


@pytest.mark.parametrize("bad", ["not-a-dtype", "U3", object, np.dtype("S2")])
def test_non_array_dtypes_raise_a_typed_error_naming_the_dtype(bad):
    with pytest.raises(MeshplanTypeError, match="dtype="):
        dtype_bits(bad)


@pytest.mark.parametrize("bad_shape", [(-1, 2), (2.0,), (True,), "ab", None])
def test_bad_shapes_raise_a_typed_error(bad_shape):
    with pytest.raises(MeshplanTypeError, match="shape="):
        array_bytes(bad_shape, np.float32)
