"""What a comparison is asked in text: cluster lists and ranges, sizes of one kind, prices, token counts.

``"8x8xH100,4x8xH200,v5p-128,v6e-256"`` is four clusters; a brace range doubles
from its low end to its high end (``"v5p-{32..512}"`` is v5p-32, -64, -128, -256,
-512; ``"{1..16}x8xH100"`` is 1, 2, 4, 8, 16 nodes) and a brace list takes each
item (``"{2,4,6}x8xB200"``). ``--nodes 1,2,4 --device H100`` is the node form of
one kind. Prices are ``KIND=USD per device-hour`` (``"H100=2.49,v5p=4.20"``); a
token count takes a decimal suffix (``"2T"``, ``"500B"``, ``"1.5e12"``).

Every mistake is a :class:`~meshplan.errors.CompareError` (or the
:class:`~meshplan.errors.ClusterError` of the cluster it names) that quotes the
item and says what would be valid. Doubling, not counting: bash's ``{32..512}``
would list every integer, almost none of which is a slice or a node count
anyone rents.
"""

from __future__ import annotations

import decimal
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from meshplan.pure.cluster import DEVICE_SPECS, Cluster, DeviceSpec, parse_cluster
from meshplan.pure.cluster._devices import _ALIASES
from meshplan.pure.errors import ClusterError, CompareError, MeshplanTypeError

__all__ = ["MAX_OPTIONS", "MAX_TOKENS", "check_prices", "expand_braces", "node_range", "parse_cluster_list",
           "parse_prices", "parse_tokens", "price_key"]

MAX_OPTIONS = 64
"""The most options one comparison takes (each is a mesh search and, verified, a few compiles)."""

_BRACE = re.compile(r"\{([^{}]*)\}")
_RANGE = re.compile(r"^\s*(\d{1,7})\s*\.\.\s*(\d{1,7})\s*$")


def _split_top(text: str) -> list[str]:
    """``text`` split at the commas outside braces."""
    out: list[str] = []
    cur: list[str] = []
    depth = 0
    for ch in text:
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
        if ch == "," and depth == 0:
            out.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    out.append("".join(cur))
    return out


def _brace_values(inner: str, item: str) -> list[str]:
    """The values one ``{...}`` stands for: a doubling range ``a..b`` or a comma list."""
    span = _RANGE.match(inner)
    if span:
        low, high = int(span[1]), int(span[2])
        if low < 1 or high < low:
            raise CompareError(f"cluster item {item!r}: the range {{{inner}}} needs 1 <= low <= high "
                               "(it doubles from low to high: {32..512} is 32, 64, 128, 256, 512).")
        values, n = [], low
        while n <= high:
            values.append(str(n))
            n *= 2
        return values
    parts = [p.strip() for p in inner.split(",")]
    if ".." in inner or not all(parts):
        raise CompareError(f"cluster item {item!r}: {{{inner}}} is neither a range {{LOW..HIGH}} (doubling) nor a "
                           "list {A,B,C}.")
    return parts


def expand_braces(item: str) -> tuple[str, ...]:
    """Every cluster text one item stands for, in order (braces expanded left to right; no braces: itself).

    Args:
      item: one cluster item, e.g. ``"v5p-{32..128}"`` or ``"{1,2}x8xH100"``.

    Returns:
      The expanded texts, duplicates kept once, in the order written.

    Raises:
      CompareError: an empty, unbalanced or malformed brace, or more than :data:`MAX_OPTIONS` results.
      MeshplanTypeError: ``item`` is not a str.

    Example:
      >>> expand_braces("v5p-{32..128}")
      ('v5p-32', 'v5p-64', 'v5p-128')
      >>> expand_braces("{1,4}x8xH100")
      ('1x8xH100', '4x8xH100')
    """
    if not isinstance(item, str):
        raise MeshplanTypeError(f"cluster item={item!r:.60} must be a str such as 'v5p-128'.")
    if item.count("{") != item.count("}"):
        raise CompareError(f"cluster item {item!r}: unbalanced braces; write e.g. 'v5p-{{32..512}}'.")
    done: list[str] = []
    todo = [item]
    while todo:
        text = todo.pop(0)
        match = _BRACE.search(text)
        if match is None:
            if "{" in text or "}" in text:
                raise CompareError(f"cluster item {item!r}: nested or misplaced braces; write e.g. "
                                   "'{1..16}x8xH100'.")
            if text not in done:
                done.append(text)
            continue
        todo = [text[:match.start()] + v + text[match.end():] for v in _brace_values(match[1], item)] + todo
        if len(todo) + len(done) > MAX_OPTIONS:
            raise CompareError(f"cluster item {item!r} stands for more than {MAX_OPTIONS} clusters; compare "
                               "fewer (each is a mesh search and a few compiles).")
    return tuple(done)


def parse_cluster_list(text: str | Sequence[str], *,
                       devices: Mapping[str, DeviceSpec] | None = None) -> tuple[Cluster, ...]:
    """The clusters of ``--clusters``: comma-separated items, each a cluster text or a brace range of them.

    Args:
      text: ``"8x8xH100,4x8xH200,v5p-128,v6e-256"``, ``"v5p-{32..512}"``, or a sequence of such items.
      devices: the device table the items name (default :data:`~meshplan.pure.cluster.DEVICE_SPECS`).

    Returns:
      The clusters in the order written, each once (a cluster written twice, even spelt two ways, is one
      option).

    Raises:
      CompareError: an empty list or item, a malformed brace, more than :data:`MAX_OPTIONS` clusters.
      ClusterError: an item that is no cluster; the message names the item and the known devices.
      MeshplanTypeError: ``text`` is neither a str nor a sequence of str.

    Example:
      >>> [c.text for c in parse_cluster_list("8x8xH100, v5p-{64..128}")]
      ['8x8xH100', 'v5p-64', 'v5p-128']
    """
    if isinstance(text, str):
        items = _split_top(text)
    elif isinstance(text, Sequence) and all(isinstance(t, str) for t in text):
        items = [piece for t in text for piece in _split_top(t)]
    else:
        raise MeshplanTypeError(f"clusters={text!r:.80} must be a str such as '8x8xH100,v5p-128' or a list of "
                                "such strs.")
    del text
    out: list[Cluster] = []
    for i, raw in enumerate(items):
        item = raw.strip()
        if not item:
            raise CompareError(f"cluster item {i + 1} is empty in the list; separate clusters with single commas, "
                               "e.g. '8x8xH100,v5p-128'.")
        for one in expand_braces(item):
            try:
                cluster = parse_cluster(one, devices=devices)
            except ClusterError as err:
                where = f"cluster item {i + 1} ({item!r})" if one == item else f"{one!r} (from item {item!r})"
                raise ClusterError(f"{where}: {err}") from None
            if cluster not in out:
                out.append(cluster)
            if len(out) > MAX_OPTIONS:
                raise CompareError(f"more than {MAX_OPTIONS} clusters to compare; compare fewer.")
    if not out:
        raise CompareError("no clusters to compare; give e.g. '8x8xH100,v5p-128'.")
    return tuple(out)


def node_range(device: str, nodes: Sequence[int] | str) -> tuple[Cluster, ...]:
    """Clusters of one GPU kind at several node counts: ``--nodes 1,2,4 --device H100``.

    Args:
      device: a catalogue GPU name (``"H100"``); TPUs are sized by slice (``"v5p-{32..512}"``).
      nodes: node counts, or their text (``"1,2,4,8"`` or ``"{1..16}"``).

    Returns:
      One cluster per count, each of the device's default devices per node.

    Raises:
      CompareError: no counts, a count that is no positive int, a TPU device.
      ClusterError: an unknown device (naming the known ones).

    Example:
      >>> [c.text for c in node_range("H100", "1,2,4")]
      ['1x8xH100', '2x8xH100', '4x8xH100']
    """
    if not isinstance(device, str):
        raise MeshplanTypeError(f"device={device!r:.60} must be a catalogue name such as 'H100'.")
    try:
        spec = DEVICE_SPECS[price_key(device)]
    except CompareError:
        spec = parse_cluster(device).device  # ClusterError naming the known devices (and a close match)
    if spec.ici_scope == "slice":
        raise CompareError(f"--device {device}: TPUs are sized by slice, not nodes; write e.g. "
                           f"--clusters '{spec.name}-{{32..512}}'.")
    counts: list[Any]
    if isinstance(nodes, str):
        counts = [c for piece in _split_top(nodes) for c in expand_braces(piece.strip())]
    elif isinstance(nodes, Sequence):
        counts = list(nodes)
    else:
        raise MeshplanTypeError(f"nodes={nodes!r:.60} must be counts such as [1, 2, 4] or their text '1,2,4'.")
    texts = []
    for n in counts:
        value = n.strip() if isinstance(n, str) else n
        ok = (isinstance(value, int) and not isinstance(value, bool)) or (isinstance(value, str) and value.isdigit()
                                                                          and len(value) < 8)
        if not ok or int(value) < 1:
            raise CompareError(f"--nodes item {n!r:.40} must be a node count >= 1 (e.g. --nodes 1,2,4,8).")
        texts.append(f"{int(value)}x{spec.devices_per_node}x{spec.name}")
    if not texts:
        raise CompareError("--nodes lists no node counts; give e.g. --nodes 1,2,4,8.")
    return parse_cluster_list(texts)


def price_key(kind: str, devices: Mapping[str, DeviceSpec] | None = None) -> str:
    """The catalogue name a price's kind refers to (``"h100"`` -> ``"H100"``, ``"trillium"`` -> ``"v6e"``).

    Raises:
      CompareError: an unknown kind; the message lists the known ones.

    Example:
      >>> price_key("h100"), price_key("Trillium")
      ('H100', 'v6e')
    """
    if not isinstance(kind, str):
        raise MeshplanTypeError(f"price kind={kind!r:.40} must be a device kind such as 'H100'.")
    table = DEVICE_SPECS if devices is None else _table(devices)
    by_lower = {k.lower(): k for k in table}
    key = kind.strip().lower()
    if key in by_lower:
        return by_lower[key]
    if table is DEVICE_SPECS and key in _ALIASES:
        return _ALIASES[key]
    raise CompareError(f"price for unknown device kind {kind.strip()!r:.40}; known kinds: "
                       f"{sorted(table, key=str.lower)}.")


def _table(devices: Any) -> Mapping[str, DeviceSpec]:
    if not isinstance(devices, Mapping) or not all(isinstance(k, str) and isinstance(v, DeviceSpec)
                                                   for k, v in devices.items()):
        raise MeshplanTypeError(f"devices={devices!r:.60} must map names to DeviceSpec.")
    return devices


_MAX_PRICE = 1e6  # USD per device-hour: beyond any rental; refuses a misplaced decimal point early


def parse_prices(text: str | Mapping[str, Any], *,
                 devices: Mapping[str, DeviceSpec] | None = None) -> dict[str, float]:
    """``--price H100=2.49,v5p=4.20``: USD per device-hour for each device kind, keyed by catalogue name.

    Args:
      text: ``"KIND=PRICE,..."`` or a mapping of kind to price.
      devices: the device table kinds are looked up in (default the catalogue).

    Returns:
      ``{catalogue name: price}``, sorted by name.

    Raises:
      CompareError: an item without ``=``, a price that is not a finite number > 0 (or absurd), an
        unknown kind, a kind priced twice.
      MeshplanTypeError: ``text`` is neither a str nor a mapping.

    Example:
      >>> parse_prices("H100=2.49, v5p=4.20")
      {'H100': 2.49, 'v5p': 4.2}
    """
    if isinstance(text, str):
        pairs = []
        for item in text.split(","):
            kind, sep, value = item.partition("=")
            if not item.strip():
                raise CompareError(f"--price {text!r:.80}: an empty item; write KIND=USD_PER_DEVICE_HOUR,... "
                                   "(e.g. H100=2.49,v5p=4.20).")
            if not sep or not kind.strip():
                raise CompareError(f"--price item {item.strip()!r:.40} must be KIND=USD_PER_DEVICE_HOUR "
                                   "(e.g. H100=2.49).")
            pairs.append((kind, value))
    elif isinstance(text, Mapping):
        pairs = []
        for kind, value in text.items():
            if not isinstance(kind, str):
                raise MeshplanTypeError(f"price kind {kind!r:.40} must be a str such as 'H100'.")
            pairs.append((kind, value))
    else:
        raise MeshplanTypeError(f"prices={text!r:.80} must be a str such as 'H100=2.49,v5p=4.20' or a mapping.")
    out: dict[str, float] = {}
    for kind, value in pairs:
        key = price_key(kind, devices)
        price = _price_value(kind, value)
        if key in out:
            raise CompareError(f"--price gives {key} twice; give each kind one price.")
        out[key] = price
    if not out:
        raise CompareError("--price lists no prices; give e.g. H100=2.49,v5p=4.20.")
    return dict(sorted(out.items()))


def _price_value(kind: str, value: Any) -> float:
    written = value.strip() if isinstance(value, str) else repr(value)
    shown = f"--price {kind.strip()}={written}"
    if isinstance(value, bool):
        raise CompareError(f"{shown}: the price must be a number (USD per device-hour), e.g. {kind.strip()}=2.49.")
    if isinstance(value, str):
        try:
            price = float(value.strip().lstrip("$"))
        except ValueError:
            raise CompareError(f"{shown:.60}: the price must be a number (USD per device-hour), e.g. "
                               f"{kind.strip()}=2.49.") from None
    elif isinstance(value, (int, float)):
        price = float(value)
    else:
        raise MeshplanTypeError(f"{shown:.60}: the price must be a number (USD per device-hour).")
    if not math.isfinite(price) or price <= 0:
        raise CompareError(f"{shown:.60}: the price must be a finite number > 0 (USD per device-hour).")
    if price > _MAX_PRICE:
        raise CompareError(f"{shown:.60}: {price:g} USD per device-hour is beyond any rental (at most "
                           f"{_MAX_PRICE:g}); check the decimal point.")
    return price


_SUFFIX = {"": 1, "K": 10**3, "M": 10**6, "B": 10**9, "G": 10**9, "T": 10**12, "P": 10**15}
_TOKENS = re.compile(r"^\s*(\d+(?:\.\d+)?(?:[eE][+]?\d{1,2})?)\s*([KMBGTP]?)\s*$", re.IGNORECASE)
MAX_TOKENS = 10**18  # a quintillion tokens: far past any training run


def parse_tokens(text: str | int) -> int:
    """``--tokens 2T``: a token count, with a decimal suffix K, M, B (or G), T, P.

    Args:
      text: ``"2T"``, ``"500B"``, ``"1.5e12"``, ``"2000000"`` or an int.

    Returns:
      The count as an int (rounded to a whole token).

    Raises:
      CompareError: text that does not parse, a count below 1 or beyond 10**18.
      MeshplanTypeError: neither a str nor an int.

    Example:
      >>> parse_tokens("2T"), parse_tokens("1.5B"), parse_tokens("4e9")
      (2000000000000, 1500000000, 4000000000)
    """
    if isinstance(text, bool) or not isinstance(text, (str, int)):
        raise MeshplanTypeError(f"tokens={text!r:.40} must be a count such as '2T' or 2000000000000.")
    if isinstance(text, int):
        count = text
    else:
        match = _TOKENS.match(text)
        if match is None:
            raise CompareError(f"--tokens {text!r:.40} is not a token count; write e.g. 2T, 500B, 1.5e12 or "
                               "2000000000000 (K, M, B/G, T, P are powers of 1000).")
        # Decimal, not float: a count past 2**53 tokens reads back exactly.
        count = int((decimal.Decimal(match[1]) * _SUFFIX[match[2].upper()]).to_integral_value())
    if not 1 <= count <= MAX_TOKENS:
        raise CompareError(f"--tokens {text!r:.40} must be between 1 and 10**18 tokens.")
    return count



def check_prices(prices: Mapping[str, float], clusters: Sequence[Cluster]) -> None:
    """Refuse a price for a device kind no compared cluster has (a typo would silently price nothing).

    Raises:
      CompareError: naming the priced kind and the kinds compared.

    Example:
      >>> check_prices({"H100": 2.0}, parse_cluster_list("1x8xH100"))
      >>> check_prices({"v5p": 4.2}, parse_cluster_list("1x8xH100"))
      Traceback (most recent call last):
      ...
      meshplan.pure.errors.CompareError: --price v5p: no compared cluster has v5p devices (compared: ['H100']); price the kinds compared.
    """
    if not isinstance(prices, Mapping) or not all(isinstance(k, str) for k in prices):
        raise MeshplanTypeError(f"prices={prices!r:.60} must map device kinds (str) to prices (parse_prices' answer).")
    if isinstance(clusters, (str, bytes)) or not isinstance(clusters, Sequence) or not all(
            isinstance(c, Cluster) for c in clusters):
        raise MeshplanTypeError(f"clusters={clusters!r:.60} must be a sequence of Cluster (parse_cluster_list's).")
    kinds = sorted({c.device.name for c in clusters})
    for kind in sorted(prices):
        if kind not in kinds:
            raise CompareError(f"--price {kind}: no compared cluster has {kind} devices (compared: {kinds}); "
                               "price the kinds compared.")
