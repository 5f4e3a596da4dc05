"""What a comparison reads from text: cluster lists and brace ranges, node counts, prices, token counts."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from meshplan.errors import ClusterError, CompareError, MeshplanTypeError
from meshplan.pure.cluster import DEVICE_SPECS, parse_cluster
from meshplan.pure.compare import (
    MAX_OPTIONS,
    check_prices,
    expand_braces,
    node_range,
    parse_cluster_list,
    parse_prices,
    parse_tokens,
)


def test_the_issue_cluster_list_reads_in_order() -> None:
    got = parse_cluster_list("8x8xH100,4x8xH200,v5p-128,v6e-256")
    assert [c.text for c in got] == ["8x8xH100", "4x8xH200", "v5p-128", "v6e-256"]


def test_a_brace_range_doubles_from_low_to_high() -> None:
    assert expand_braces("v5p-{32..512}") == ("v5p-32", "v5p-64", "v5p-128", "v5p-256", "v5p-512")
    assert expand_braces("{1..16}x8xH100") == tuple(f"{n}x8xH100" for n in (1, 2, 4, 8, 16))
    assert expand_braces("{3..20}xH100") == ("3xH100", "6xH100", "12xH100")


@given(st.integers(1, 4096), st.integers(0, 10))
def test_a_range_holds_low_each_value_twice_the_last_and_nothing_past_high(low: int, span: int) -> None:
    high = low * 2**span + (low - 1)  # anywhere between two doublings
    values = [int(v) for v in expand_braces(f"{{{low}..{high}}}")]
    assert values[0] == low and all(b == 2 * a for a, b in zip(values, values[1:]))
    assert values[-1] <= high < 2 * values[-1]


def test_brace_lists_and_several_braces_expand_left_to_right_keeping_the_first_of_repeats() -> None:
    assert expand_braces("{2,4}x{8,4}xB200") == ("2x8xB200", "2x4xB200", "4x8xB200", "4x4xB200")
    assert expand_braces("{2,2,4}xH100") == ("2xH100", "4xH100")
    assert expand_braces("H100") == ("H100",)


def test_a_cluster_written_twice_is_one_option() -> None:
    assert [c.text for c in parse_cluster_list("2xH100, 2x8xH100,{1,2}xH100")] == ["2x8xH100", "1x8xH100"]


@pytest.mark.parametrize(("text", "error", "fragment"), [
    ("8x8xH100,,v5p-128", CompareError, "cluster item 2 is empty"),
    ("8x8xH100,8x8xH1000", ClusterError, r"cluster item 2 \('8x8xH1000'\): unknown device 'h1000'; known devices"),
    ("v5p-{12..24}", ClusterError, r"'v5p-12' \(from item 'v5p-\{12..24\}'\): 'v5p-12': no v5p slice"),
    ("v5p-{64..32}", CompareError, "needs 1 <= low <= high"),
    ("v5p-{32..", CompareError, "unbalanced braces"),
    ("v5p-{32...64}", CompareError, "neither a range"),
    ("{1..2}{", CompareError, "unbalanced"),
    ("}{", CompareError, "nested or misplaced"),
    ("{1..1000000}x{1..100000}xH100", CompareError, f"more than {MAX_OPTIONS}"),
    ("", CompareError, "cluster item 1 is empty"),
    ("blah-9", ClusterError, "known devices"),
])
def test_a_bad_cluster_list_names_the_bad_item(text: str, error: type, fragment: str) -> None:
    with pytest.raises(error, match=fragment):
        parse_cluster_list(text)


def test_an_unknown_device_kind_lists_every_known_kind() -> None:
    with pytest.raises(ClusterError) as info:
        parse_cluster_list("8x8xH100,2xB300")
    for name in DEVICE_SPECS:
        assert name in str(info.value)


def test_cluster_lists_refuse_non_strings() -> None:
    with pytest.raises(MeshplanTypeError):
        parse_cluster_list(42)  # type: ignore[arg-type]
    with pytest.raises(MeshplanTypeError):
        parse_cluster_list(["8x8xH100", 3])  # type: ignore[list-item]


def test_node_ranges_are_the_node_form_of_one_gpu_kind() -> None:
    assert [c.text for c in node_range("H100", [1, 2, 4])] == ["1x8xH100", "2x8xH100", "4x8xH100"]
    assert [c.text for c in node_range("GB200", "{9..36}")] == ["9x4xGB200", "GB200-NVL72", "2xGB200-NVL72"]
    with pytest.raises(CompareError, match="TPUs are sized by slice"):
        node_range("v5p", "1,2")
    with pytest.raises(CompareError, match="--nodes item 'x'"):
        node_range("H100", "1,x")
    with pytest.raises(CompareError, match="--nodes item 0"):
        node_range("H100", [0])
    with pytest.raises(ClusterError, match="known devices"):
        node_range("H1000", "1")


def test_prices_key_by_catalogue_name_whatever_the_spelling() -> None:
    assert parse_prices("h100=2.49, V5P=4.20,trillium=$2.7") == {"H100": 2.49, "v5p": 4.2, "v6e": 2.7}
    assert parse_prices({"H200": 3}) == {"H200": 3.0}


@pytest.mark.parametrize(("text", "fragment"), [
    ("H100", "must be KIND=USD_PER_DEVICE_HOUR"),
    ("H100=abc", r"--price H100=abc: the price must be a number"),
    ("H100=-2", "finite number > 0"),
    ("H100=0", "finite number > 0"),
    ("H100=nan", "finite number > 0"),
    ("H100=inf", "finite number > 0"),
    ("H100=1e9", "beyond any rental"),
    ("H100=2,h100=3", "gives H100 twice"),
    ("B300=2", r"unknown device kind 'B300'; known kinds"),
    ("H100=2,", "an empty item"),
    ("=2", "must be KIND"),
])
def test_a_bad_price_is_a_typed_error_naming_it(text: str, fragment: str) -> None:
    with pytest.raises(CompareError, match=fragment):
        parse_prices(text)


def test_a_price_for_a_kind_not_compared_is_refused() -> None:
    clusters = parse_cluster_list("8x8xH100,v5p-128")
    check_prices({"H100": 2.0, "v5p": 4.0}, clusters)
    with pytest.raises(CompareError, match=r"--price H200: no compared cluster has H200 devices \(compared: "
                                           r"\['H100', 'v5p'\]\)"):
        check_prices({"H200": 3.0}, clusters)


@given(st.floats(0.001, 1e5, allow_nan=False), st.sampled_from(sorted(DEVICE_SPECS)))
def test_a_price_round_trips_through_its_text(price: float, kind: str) -> None:
    assert math.isclose(parse_prices(f"{kind}={price!r}")[kind], price)


@pytest.mark.parametrize(("text", "count"), [("2T", 2 * 10**12), ("500B", 5 * 10**11), ("1.5e12", 1_500_000_000_000),
                                             ("300m", 300 * 10**6), ("2000", 2000), (" 7 k ", 7000), ("1G", 10**9)])
def test_token_counts_read_their_decimal_suffixes(text: str, count: int) -> None:
    assert parse_tokens(text) == count


@pytest.mark.parametrize("text", ["two", "2TB", "-2T", "0", "1e40", "2 T B", "", "nan", "inf", "1,000"])
def test_a_bad_token_count_is_a_typed_error_naming_it(text: str) -> None:
    with pytest.raises(CompareError, match="--tokens"):
        parse_tokens(text)
    with pytest.raises(MeshplanTypeError):
        parse_tokens(2.5)  # type: ignore[arg-type]


@given(st.integers(1, 10**15), st.sampled_from([("", 1), ("K", 10**3), ("M", 10**6), ("B", 10**9), ("T", 10**12)]))
def test_a_whole_count_with_any_suffix_reads_back_exactly(n: int, suffix: tuple[str, int]) -> None:
    text, scale = suffix
    if n * scale <= 10**18:
        assert parse_tokens(f"{n}{text}") == n * scale


def test_every_cluster_text_in_the_catalogue_forms_parses_back_through_the_list() -> None:
    texts = ["8x8xH100", "GB200-NVL72", "2xGB200-NVL72", "tpu7x-128", "v6e-256", "1x8xMI325X", "4x8xH20", "2xH800"]
    assert [c.text for c in parse_cluster_list(",".join(texts))] == [parse_cluster(t).text for t in texts]
