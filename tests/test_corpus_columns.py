"""The corpus columns that tell runs apart (kvjax.predict.corpus): a sliding window the bound
counts, derived by hand here, and the run's set-up columns read and refused as the others."""

import pytest

from kvjax.errors import KvjaxError
from kvjax.predict.bounds import closed_form
from kvjax.predict.corpus import read_csv

HEADER = (
    "source,source_group,chip,dtype,kernel,implementation,batch,seq_q,seq_kv,num_heads,"
    "num_kv_heads,head_dim,causal,m,n,k,measured_s,window,l2_flushed,clock_locked,"
    "implementation_version\n"
)


def _rows(tmp_path, *lines):
    path = tmp_path / "mine.csv"
    path.write_text(HEADER + "".join(line + "\n" for line in lines))
    return read_csv(path)


def test_a_windowed_prefill_and_decode_are_bounded_by_the_pairs_and_keys_in_the_window(tmp_path):
    prefill, full, decode = _rows(
        tmp_path,
        "s,g,h100-sxm,bf16,attention_prefill,cuDNN,1,8192,8192,64,8,64,true,,,,1e-3,128,,,",
        "s,g,h100-sxm,bf16,attention_prefill,cuDNN,1,8192,8192,64,8,64,true,,,,1e-3,,,,",
        "s,g,h100-sxm,bf16,attention_decode,FA,8,1,32768,64,8,64,,,,,1e-3,128,false,1500,v2",
    )
    # T = 8,192 queries, W = 128: the first 128 see 1..128 keys, the other 8,064 see 128 each;
    # 64 heads x (2 x 64 + 2 x 64) FLOPs a pair
    pairs = 128 * 129 // 2 + (8192 - 128) * 128
    assert closed_form(prefill).floor_flops == 64 * pairs * 256
    assert closed_form(full).floor_flops == 64 * (8192 * 8193 // 2) * 256
    # decode reads the window's 128 keys of each of B x 8 KV heads (K and V, 2 bytes), and Q
    # and O of 64 heads x 64 once
    cache = 8 * 8 * 128 * 2 * 64 * 2
    assert closed_form(decode).floor_bytes == cache + 2 * 8 * 64 * 64 * 2
    assert (decode.l2_flushed, decode.clock_locked, decode.implementation_version) == (
        False,
        1500,
        "v2",
    )


@pytest.mark.parametrize(
    ("line", "says"),
    [
        ("s,g,h100-sxm,bf16,matmul,cuBLAS,,,,,,,,64,64,64,1e-3,128,,,", "'window': a matmul row"),
        (
            "s,g,h100-sxm,bf16,attention_prefill,x,1,64,64,8,8,64,false,,,,1e-3,16,,,",
            "'window': a sliding window is causal",
        ),
        ("s,g,h100-sxm,bf16,matmul,cuBLAS,,,,,,,,64,64,64,1e-3,,maybe,,", "'l2_flushed'"),
        ("s,g,h100-sxm,bf16,matmul,cuBLAS,,,,,,,,64,64,64,1e-3,,,-5,", "'clock_locked'"),
    ],
)
def test_a_bad_run_column_is_refused_with_its_name(tmp_path, line, says):
    with pytest.raises(KvjaxError, match=says):
        _rows(tmp_path, line)
