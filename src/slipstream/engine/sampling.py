"""Token sampling with counter-based randomness, and the behaviour log-probability.

Randomness. Each request carries a seed; its t-th token takes one uniform number `u`, a hash of
(seed, t), and is the inverse-CDF draw from the softmax of its row: the first token `a` whose
cumulative probability exceeds `u` (this samples the softmax, to `u`'s resolution: below). The
row's computation reads only that row, always in the same order (the vocabulary in fixed chunks
of `CHUNK`, each exponentiated and summed in blocks of `SUB`; then the cumulative sum of the
blocks, and the cumulative sum inside the block `u` falls in), so given the same logits a
request sampled inside a continuous batch gives the same tokens as sampled alone (bit for bit,
tests/test_engine_sampling.py), and a run is reproducible from its seeds. The logits themselves
are the model's: a matrix product's kernel can change with the batch's row count (on this CPU a
row's logits moved by about 3e-6 between 1-3 rows and more), which can move a draw near a
boundary of the CDF; the guarantee is the sampler's, not the forward's. One uniform per row
instead of one Gumbel variate per vocabulary entry: at a 151,936-token vocabulary, hashing the
whole `[rows, vocab]` table cost several times the decode step's own matrix products on a CPU.
On a CPU the chunks stay in cache and no `[rows, vocab]` temporary is allocated; elsewhere the
whole row is one chunk (fewer kernels), on a GPU a decode step's sampling is captured as a CUDA
graph (`sample_static`), and where Triton runs, one kernel reads the logits once for the block
sums and the argmax (`engine.fused`; its own rounding, so a device samples through it for a
whole run or not).

Resolution. `u` has 32 bits (`row_uniform`): token `a` is drawn with probability (grid
points `(k + 0.5) / 2^32` in its CDF interval) / 2^32, within 2^-32 = 2.3e-10 of `p(a)`; a
token below that is drawn with probability 0 or 2^-32 at a given row, not never. The interval
boundaries move with the logits from one token to the next, so the error has mean zero over
draws, except in the CDF's first and last 2^-33, where `u` never falls (a bias of at most
2^-32 a draw). Measured on synthetic rows of 151,936 logits: a total variation from the
softmax of 3e-6 to 6e-6 per draw, falling as 1 / sqrt(n) over jittered copies of a row. The
usual float32 samplers (`torch.multinomial` of one sample, vLLM's `random_sample`: the argmax
of `p / q` with float32 exponentials) resolve a token's chance in steps of about 2^-24, 256
times coarser. 53 bits from two hashes would change every seed's tokens for an error some
3e10 draws of one row would be needed to see: kept at 32.

Behaviour log-probability. We record `log p(a)`, `p = softmax(logits / temperature)` over the
whole vocabulary: the distribution the trainer evaluates (`train.batch.token_logprobs`), so
with identical weights the trainer's ratio is exactly 1.

What top-k and top-p do to the importance ratio. With either on, the token is drawn from the
truncated distribution `mu(a) = p(a) / Z` on the kept set K (`Z = sum_{a in K} p(a) <= 1`, per
token, computed on the temperature-scaled logits: temperature first, then the filters, as in
vLLM and `transformers`). The recorded log-prob stays `log p(a)`, so the ratio the trainer forms,
`pi(a) / p(a)`, is the true importance ratio `pi(a) / mu(a)` divided by `Z`: it reads 1
on-policy where the truth is `Z`, and it is biased upward by `1 / Z` off-policy. Tokens outside
K have `mu = 0` and are never sampled, so no ratio corrects for them: the update follows the
truncated policy. Each completion of a request that filters also records `log Z` per token
(`Completion.kept_logmass`, `Sample.kept_logmass_T`; None without filtering); the recorded
log-prob minus it is `log mu(a)`, the exact behaviour log-prob, which the trainer uses with
`trainer.behavior_logprobs = "truncated"` for the unbiased ratio. Defaults (top_k 0, top_p 1)
give Z = 1: keep them for RL, or choose between the bias and the exact weight knowingly.

Greedy rows (temperature 0) take the argmax and record the log-prob at temperature 1; they are
for evaluation, not for RL. No filter applies to them (the argmax is in every top-k / top-p
set): `SamplingParams` sets a greedy request's top_k and top_p to 0 and 1, as vLLM does.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

_MASK32 = 0xFFFFFFFF
LOG2E = 1.4426950408889634
CHUNK = 4096  # vocabulary entries per chunk on a CPU (a [rows, CHUNK] scratch stays in cache)
SUB = 128  # entries per block inside a chunk, for the draw's second level


def _hash32(x: torch.Tensor) -> torch.Tensor:
    """lowbias32 integer hash on int64 tensors holding 32-bit values."""
    x = x & _MASK32
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & _MASK32
    x = x ^ (x >> 15)
    x = (x * 0x846CA68B) & _MASK32
    return x ^ (x >> 16)


def row_uniform(seeds: torch.Tensor, steps: torch.Tensor) -> torch.Tensor:
    """One uniform number in (0, 1) per row `[B]` (float64) from request seeds and token
    indices `[B]`: `(k + 0.5) / 2^32`, `k` a 32-bit hash of both, so a request's tokens
    depend on its seed and step, never on its slot or batch. 32 bits are enough: the module
    docstring's "Resolution" (each token's chance off by under 2^-32, with mean zero)."""
    key = _hash32(_hash32(seeds.to(torch.int64) * 0x9E3779B1 + steps.to(torch.int64)) + 0x2545F491)
    return (key.double() + 0.5) / 4294967296.0


def filter_logits(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Set logits outside each row's top-k / nucleus to -inf. `top_k` 0 and `top_p` 1 keep all.

    As transformers' and vLLM's samplers: top-k keeps every logit at least the k-th largest
    (ties with it included, so top-k 1 keeps what greedy decoding picks), then top-p keeps the
    smallest prefix of what is left, renormalised, whose mass reaches p."""
    if bool((top_k <= 0).all()) and bool((top_p >= 1.0).all()):
        return logits
    V = logits.shape[-1]
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    k = torch.where(top_k > 0, top_k.clamp(max=V), torch.full_like(top_k, V))[:, None]
    kth = sorted_logits.gather(-1, k - 1)
    sorted_logits = sorted_logits.masked_fill(sorted_logits < kth, float("-inf"))
    probs = sorted_logits.softmax(dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs
    # always keeps the most likely token; a row with top_p 1 keeps all (its cumulative mass
    # can round to 1 before the end, which must not cut its tail when a neighbour filters)
    drop = (mass_before >= top_p[:, None]) & (top_p[:, None] < 1.0)
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.empty_like(logits).scatter_(-1, order, sorted_logits)


class Sampled(NamedTuple):
    tokens: torch.Tensor  # [B] long
    logp: torch.Tensor  # [B] log p(token), p the temperature-scaled full softmax
    kept_logmass: torch.Tensor | None  # [B] log Z of the top-k / top-p set; None: no filter


def sample(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    seeds: torch.Tensor,
    steps: torch.Tensor,
    one_chunk: bool | None = None,
    fused: bool | None = None,
) -> Sampled:
    """Next tokens `[B]` and their behaviour log-probs `[B]` from last-position logits `[B, V]`.

    `temperature`, `top_k`, `top_p`, `seeds` and `steps` (the index of the token being sampled
    within its completion) are per row `[B]`. Rows with temperature 0 are greedy: the first
    index of the row's largest logit, whatever their top-k and top-p. `logits` is not
    modified.

    Every row goes through the same arithmetic, filtered or not: `e = exp(x / t - m)` with
    `m = r / t`, `r` a logit of the row near its top (`_block_sums`: no pass is spent on the
    exact maximum), zeroed outside the kept set, so a row's token does not depend on whether a
    neighbour in the batch filters or is greedy. The recorded log-prob is `x_a / t - m - log
    sum(e)` over the whole row, computed with a float64 sum of float32 block sums (closer to
    the exact value than a float32 `log_softmax`).

    `one_chunk` (default: off on a CPU, on elsewhere) takes the row as one chunk, shifted by
    its maximum, with the temperature's scale as a `[B, 1]` tensor: fewer kernels and no host
    read of the temperatures, the arithmetic `sample_static` shares.

    `fused` (default: where `engine.fused.available` says so, a CUDA device with Triton) takes
    the block sums, the row maximum and the argmax in one read of the logits
    (`engine.fused.tile_sums`, one chunk); its tokens are then the kernel's, not bit for bit
    the eager path's (the kernel's `exp2`), so a device samples through one or the other for
    a whole run.
    """
    if fused is None:
        fused = fused_default(logits.device)
    one = (logits.device.type != "cpu" if one_chunk is None else one_chunk) or fused
    greedy = temperature <= 0
    # the filters only change the draw of a sampled row: a greedy row's are never applied
    filtered = bool((((top_k > 0) | (top_p < 1.0)) & ~greedy).any())
    return _sample(
        logits, temperature, (top_k, top_p) if filtered else None, seeds, steps, one,
        any_greedy=bool(greedy.any()), all_greedy=bool(greedy.all()), fused=fused,
    )  # fmt: skip


def fused_default(device: torch.device) -> bool:
    """Whether `sample` on `device` goes through the fused kernel by default: on a CUDA device
    where Triton runs it (`engine.fused.available`); never on a CPU (Triton is not imported)."""
    if device.type != "cuda":
        return False
    from slipstream.engine import fused

    return fused.available(device)


def sample_static(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    seeds: torch.Tensor,
    steps: torch.Tensor,
    fused: bool = False,
) -> Sampled:
    """`sample` of unfiltered rows (top-k 0, top-p 1) in one chunk, without a single host
    synchronisation: every row is drawn and argmaxed, and the greedy rows take the argmax. This
    is what a CUDA graph can capture (engine.forward.SampleGraph); its tokens and log-probs are
    those of `sample(..., one_chunk=True, fused=fused)` bit for bit, so a row's result does not
    depend on which of the two a step used (tests/test_engine_sampling.py,
    tests/test_engine_fused.py)."""
    return _sample(
        logits, temperature, None, seeds, steps, True, any_greedy=True, all_greedy=False,
        fused=fused,
    )  # fmt: skip


def _sample(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    filters: tuple[torch.Tensor, torch.Tensor] | None,
    seeds: torch.Tensor,
    steps: torch.Tensor,
    one_chunk: bool,
    any_greedy: bool,
    all_greedy: bool,
    fused: bool = False,
) -> Sampled:
    """`sample` with its host decisions made: `filters` (top-k, top-p) when any row filters,
    whether any or all rows are greedy, and whether the row is one chunk (`one_chunk`: the
    scale is a `[B, 1]` tensor, the reference the row's maximum; else chunks of `CHUNK` and the
    rows' runs of one temperature, read on the host); `fused`: the one-chunk sums from
    `engine.fused.tile_sums`, reading the logits in their own dtype."""
    if not fused:
        logits = logits.float()
    greedy = temperature <= 0
    t = torch.where(greedy, torch.ones_like(temperature), temperature)[:, None].float()
    inv_t = 1.0 / t
    # the exponentials in base 2: exp(y) = 2^(y log2 e), and exp2 runs about 25 % faster than
    # exp on a CPU; the exponent's extra rounding is a relative 1e-7 of it
    inv_t2 = inv_t * LOG2E
    scale: Scale = inv_t2 if one_chunk else temperature_runs(inv_t2)
    keep = None
    if filters is not None:
        keep = torch.isfinite(filter_logits(logits.float() / t, *filters))
    if fused:
        sums, best = _fused_block_sums(logits, inv_t2, keep)
    else:
        chunk = logits.shape[-1] if one_chunk else CHUNK
        tops = any_greedy and not one_chunk
        sums = _block_sums(logits, inv_t2, scale, keep, chunk, with_tops=tops)
        if any_greedy:  # one chunk: argmax is one pass and takes the first of equal maxima too
            best = logits.argmax(dim=-1) if one_chunk else _argmax(logits, sums.tops, chunk)
    ref = sums.ref  # a logit of the row, the sums' reference
    log_full = sums.full.sum(dim=-1).log()  # log sum_a exp(x_a / t - m), float64
    if all_greedy:
        tokens = best
    else:
        tokens = _draw(logits, scale, inv_t2, sums, keep, row_uniform(seeds, steps), fused)
        if any_greedy:
            tokens = torch.where(greedy, best, tokens)
    # x_a / t - m in float64: `r` need not be the row's maximum, so x_a - r can be large
    s_a = (logits.gather(-1, tokens[:, None]).double() - ref.double()) * inv_t.double()
    logp = (s_a.squeeze(-1) - log_full).float()
    logmass = (sums.kept.sum(dim=-1).log() - log_full).float() if keep is not None else None
    return Sampled(tokens, logp, logmass)


Runs = list[tuple[int, int, float]]  # rows [r0, r1) sharing one `log2 e / t`
Scale = Runs | torch.Tensor  # the rows' `log2 e / t`: runs read on the host, or a [B, 1] tensor


def temperature_runs(inv_t: torch.Tensor) -> Runs:
    """The batch's rows as maximal runs of consecutive rows with one `log2 e / t` `[B, 1]`
    (a batch at one temperature, the usual case, is one run)."""
    vals = inv_t.squeeze(-1).tolist()
    runs: Runs = []
    r0 = 0
    for r in range(1, len(vals) + 1):
        if r == len(vals) or vals[r] != vals[r0]:
            runs.append((r0, r, vals[r0]))
            r0 = r
    return runs


def _exp_chunk(
    x: torch.Tensor, scale: Scale, neg_m: torch.Tensor, out: torch.Tensor | None = None
) -> torch.Tensor:
    """`exp(x / t - m)` of a `[B, n]` slice of logits, given `neg_m = -m log2 e / t` `[B, 1]`
    and each run of rows' `log2 e / t`, into `out` when given: the scaling and the shift as
    one `neg_m + (log2 e / t) x` per run (one pass over the slice, against two for a product
    then an add with a `[B, 1]` factor, and four for `addcmul`), then `exp2` in place. Every
    element goes through the same arithmetic whatever the runs, so a row's values do not
    depend on its neighbours' temperatures; the largest entry of `m`'s own slice comes out
    exactly 0 (`2^0 = 1`). `scale` as a `[B, 1]` tensor (the one-chunk path, a GPU's): one
    `addcmul` for all rows, one pointwise kernel there, with no host read (a row's arithmetic
    is then the same kernel's whatever its neighbours); the pass counts above are a CPU's."""
    out = torch.empty_like(x) if out is None else out
    if isinstance(scale, torch.Tensor):
        torch.addcmul(neg_m, x, scale, out=out)
    else:
        for r0, r1, a in scale:
            torch.add(neg_m[r0:r1], x[r0:r1], alpha=a, out=out[r0:r1])
    return out.exp2_()


class BlockSums(NamedTuple):
    shifts: torch.Tensor  # [B, n] float32: the logit each block was exponentiated against
    ref: torch.Tensor  # [B, 1] float32: the largest shift, the sums' reference (m = ref / t)
    full: torch.Tensor  # [B, n] float64: sum of exp(x / t - m) per block
    kept: torch.Tensor  # [B, n] float64: the same over the kept set (`full` when unfiltered)
    tops: torch.Tensor | None  # [B, C] float32: each chunk's largest logit, when asked for


def _block_sums(
    logits: torch.Tensor,
    inv_t: torch.Tensor,
    scale: Scale,
    keep: torch.Tensor | None,
    chunk: int,
    with_tops: bool,
) -> BlockSums:
    """One pass over the logits, a chunk at a time, each exponentiated while it is in cache,
    and summed in blocks of `SUB` entries (the draw's first level).

    The shift is a reference `r`, a logit of the row: the first chunk's largest (the row's
    largest if that chunk has no finite logit). So no separate pass reads the row for its
    maximum: `r` is an entry of the row, hence the row's sum is at least `2^0 = 1` and never
    underflows, and a chunk far below `r` adds what it would add to the exact sum, rounded
    below float32's resolution. A chunk whose sum overflows against `r` (a logit far above
    it) is redone against its own largest logit, for the rows it overflows in (rare: about
    88.7 t above `r`). The block sums are then rescaled to the largest shift in float64.
    Each row's shifts depend on its own logits alone, so a row's sums do not depend on its
    neighbours. `with_tops` also keeps each chunk's largest logit (for greedy rows).

    One chunk (`chunk >= V`): `r` is the row's maximum, so no block can overflow and nothing
    is checked on the host (a row with no finite logit gives NaN sums, as any softmax would)."""
    B, V = logits.shape
    n_chunks, n_blocks = -(-V // chunk), -(-V // SUB)
    dev = logits.device
    tops = torch.empty(B, n_chunks, dtype=torch.float32, device=dev) if with_tops else None
    full = torch.empty(B, n_blocks, dtype=torch.float64, device=dev)
    kept = full if keep is None else torch.empty_like(full)
    # each row of the scratch starts on a 64-entry boundary: the pointwise kernels take whole
    # vector lanes over a contiguous run and the rest one by one (other rounding), so with a
    # row width off the lane size, which of a row's entries were rounded which way followed
    # the row's place in the batch (at V = 15, 1 % of rows' log-probs differed from alone)
    width = min(chunk, V)
    scratch = torch.empty(B, -(-width // 64) * 64, dtype=torch.float32, device=dev)
    ref = logits[:, :chunk].amax(dim=-1, keepdim=True)
    if n_chunks > 1 and not bool(torch.isfinite(ref).all()):  # a first chunk, no finite logit
        ref = torch.where(torch.isfinite(ref), ref, logits.amax(dim=-1, keepdim=True))
    neg = -(ref * inv_t)
    spans = [(c * chunk, min((c + 1) * chunk, V)) for c in range(n_chunks)]
    for c, (a, b) in enumerate(spans):
        x = logits[:, a:b]
        if tops is not None:
            torch.amax(x, dim=-1, keepdim=True, out=tops[:, c : c + 1])
        e = _exp_chunk(x, scale, neg, scratch[:, : b - a])
        _sum_blocks(e, full[:, a // SUB :])
        if keep is not None:
            _sum_blocks(e.masked_fill_(~keep[:, a:b], 0.0), kept[:, a // SUB :])
    shifts = ref.expand(B, n_blocks)  # a view: every block shifted by `r`
    if n_chunks == 1:  # against the row's maximum: nothing overflowed
        return BlockSums(shifts, ref, full, kept, tops)
    over = ~torch.isfinite(full)  # [B, n]: a block that overflowed against `r`
    if not bool(over.any()):  # the usual case: nothing to redo or rescale
        return BlockSums(shifts, ref, full, kept, tops)
    shifts = shifts.clone()
    for a, b in spans:
        j = slice(a // SUB, -(-b // SUB))
        rows = over[:, j].any(dim=-1, keepdim=True)
        if not bool(rows.any()):
            continue
        x = logits[:, a:b]
        shift = torch.where(rows, x.amax(dim=-1, keepdim=True), ref)
        shifts[:, j] = shift
        e = _exp_chunk(x, scale, -(shift * inv_t), scratch[:, : b - a])
        _sum_blocks(e, full[:, j])
        if keep is not None:
            _sum_blocks(e.masked_fill_(~keep[:, a:b], 0.0), kept[:, j])
    # block j's exponentials against the row's largest shift: times 2^((s_j - s) log2 e / t)
    ref = shifts.amax(dim=-1, keepdim=True)
    scale = ((shifts.double() - ref.double()) * inv_t.double()).exp2()
    full.mul_(scale)
    if keep is not None:
        kept.mul_(scale)
    return BlockSums(shifts, ref, full, kept, tops)


def _fused_block_sums(
    logits: torch.Tensor, inv_t: torch.Tensor, keep: torch.Tensor | None
) -> tuple[BlockSums, torch.Tensor]:
    """`_block_sums` of one chunk from the fused kernel's tile sums, and the rows' argmax `[B]`
    (the first index of the largest logit): each block was exponentiated against its tile's
    maximum; rescaled here to the row's maximum in float64, as `_block_sums` does after an
    overflow. A tile with no finite logit has shift -inf and sums 0."""
    from slipstream.engine import fused

    got = fused.tile_sums(logits, inv_t, SUB, keep)
    n_tiles = got.tile_max.shape[1]
    ref = got.tile_max.amax(dim=-1, keepdim=True)
    tile_ids = torch.arange(n_tiles, device=logits.device).expand_as(got.tile_max)
    first = torch.where(got.tile_max == ref, tile_ids, n_tiles).amin(dim=-1, keepdim=True)
    best = got.tile_arg.gather(-1, first).squeeze(-1)
    shifts = got.tile_max.repeat_interleave(fused.TILE // SUB, dim=-1)[:, : got.full.shape[1]]
    factor = ((shifts.double() - ref.double()) * inv_t.double()).exp2()
    full = got.full.double() * factor
    kept = got.kept.double() * factor if got.kept is not None else full
    return BlockSums(shifts, ref, full, kept, None), best


def _sum_blocks(e: torch.Tensor, out: torch.Tensor) -> None:
    """Sums (float32) of consecutive blocks of `SUB` entries of `e` `[B, n]` (the last block
    may be short) into the first `ceil(n / SUB)` columns of `out`."""
    n = e.shape[1]
    whole = n // SUB
    out[:, :whole] = e[:, : whole * SUB].unflatten(-1, (whole, SUB)).sum(dim=-1)
    if n % SUB:
        out[:, whole] = e[:, whole * SUB :].sum(dim=-1)


def _argmax(logits: torch.Tensor, tops: torch.Tensor | None, chunk: int) -> torch.Tensor:
    """The first index of each row's largest logit `[B]`, from the chunk maxima: the first
    chunk holding it, then the first entry inside that chunk (as `argmax` over the row)."""
    assert tops is not None
    V = logits.shape[1]
    cols = _block_cols(tops.argmax(dim=-1), min(chunk, V), V)
    return cols.gather(-1, logits.gather(-1, cols).argmax(dim=-1, keepdim=True)).squeeze(-1)


def _block_cols(j: torch.Tensor, width: int, V: int) -> torch.Tensor:
    """The vocabulary indices `[B, width]` of block `j` `[B]` of `width` entries, clamped to
    the vocabulary (an index past it repeats `V - 1`, which comes first in the block)."""
    cols = j[:, None] * width + torch.arange(width, device=j.device)[None, :]
    return cols.clamp_(max=V - 1)


def _draw(
    logits: torch.Tensor,
    scale: Scale,
    inv_t: torch.Tensor,
    sums: BlockSums,
    keep: torch.Tensor | None,
    u: torch.Tensor,
    fused: bool = False,
) -> torch.Tensor:
    """Inverse-CDF draw `[B]`: the block of `SUB` entries where `u x total` falls, then the
    entry inside it (the block's exponentials recomputed as they were summed, against its
    shift, `fused`: as the kernel does, `x - shift` first; cumulative sums in float64)."""
    B, V = logits.shape
    rows = torch.arange(B, device=logits.device)
    j, rest = _locate(sums.kept, u * sums.kept.sum(dim=-1))
    shift = sums.shifts[rows, j][:, None]
    rest = rest * ((sums.ref - shift).double() * inv_t.double()).squeeze(-1).exp2()
    cols = _block_cols(j, SUB, V)
    x = logits.gather(-1, cols).float()
    if fused:
        e = ((x - torch.where(torch.isfinite(shift), shift, 0.0)) * inv_t).exp2_()
    else:
        neg = torch.where(torch.isfinite(shift), -(shift * inv_t), torch.zeros_like(shift))
        e = _exp_chunk(x, scale, neg)
    # an index past the vocabulary (the last block may be short) has no mass
    mass = (j[:, None] * SUB + torch.arange(SUB, device=j.device)[None, :]) < V
    if keep is not None:
        mass &= keep.gather(-1, cols)
    i, _ = _locate(e.masked_fill_(~mass, 0.0).double(), rest)
    return cols[rows, i]


def _locate(mass: torch.Tensor, value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row of non-negative `mass` `[B, n]`, the entry `i` `[B]` whose cumulative interval
    holds `value` `[B]`, and what is left of `value` past the entries before it."""
    cum = mass.cumsum(dim=-1)
    i = _first_above(cum, value)
    before = torch.where(i > 0, cum.gather(-1, (i - 1).clamp(min=0)[:, None]).squeeze(-1), 0.0)
    return i, value - before


def _first_above(cum: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """Per row of non-decreasing `cum` `[B, n]`, the first index whose entry exceeds `value`
    `[B]`. `value` is first held below the row's last entry, so the index always has a term
    `cum[i] - cum[i - 1] > 0` (rounding can put `u x total` past the end; the draw then takes
    the last entry with mass, never one with probability 0)."""
    last = cum[:, -1]
    value = torch.minimum(value.clamp(min=0.0), torch.nextafter(last, torch.zeros_like(last)))
    return torch.searchsorted(cum, value[:, None].contiguous(), right=True).squeeze(-1)
