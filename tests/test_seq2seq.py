"""Attention decoders (LSTM with weight feedback, Transformer) and the attention beam search:
weight feedback, beam 1 = greedy, batch of 1 = batch of N, CTC prefix scores, a toy task overfit,
config checks."""
import itertools
import math
import types

import pytest
import torch
import torch.nn.functional as F

from asrkit.config import ConfigError
from asrkit.decode.attention import EOS, CtcPrefixScorer, SearchOptions, beam_search, greedy_search
from asrkit.decode.methods import AttentionBeam
from asrkit.model import build_model
from asrkit.model.asr import EncoderOutput
from asrkit.model.decoders import LstmDecoderOptions, TransformerDecoderOptions
from asrkit.model.lstm_decoder import LstmDecoder, MlpAttention
from asrkit.model.transformer_decoder import TransformerDecoder
from asrkit.training.checks import load_config

torch.set_num_threads(1)
V = 9  # id 0 = blank = <sos/eos>


def _enc(lens, D=12, V=V, seed=0) -> EncoderOutput:
    g = torch.Generator().manual_seed(seed)
    B, T = len(lens), max(lens)
    lens_t = torch.tensor(lens)
    mask = torch.arange(T)[None] < lens_t[:, None]
    hidden = torch.randn(B, T, D, generator=g) * mask[..., None]
    log_probs = torch.log_softmax(2 * torch.randn(B, T, V, generator=g), -1)
    times = torch.arange(T).float()[None].expand(B, -1) * 0.08
    return EncoderOutput(hidden, lens_t, mask, times, log_probs)


def _slice(enc: EncoderOutput, i: int) -> EncoderOutput:
    n = int(enc.lengths[i])
    return EncoderOutput(enc.hidden[i:i + 1, :n], enc.lengths[i:i + 1], enc.mask[i:i + 1, :n],
                         enc.times[i:i + 1, :n], enc.log_probs[i:i + 1, :n])


def _lstm(D=12, **kw):
    o = LstmDecoderOptions(units=24, embed_dim=8, att_dim=16, readout_dim=24, dropout=0.0, label_smoothing=0.0, **kw)
    return LstmDecoder(D, V, o)


def _transformer(D=12, **kw):
    kw = {"layer_drop": 0.0, **kw}
    o = TransformerDecoderOptions(d_model=16, n_layers=2, n_heads=4, d_ff=32, dropout=0.0,
                                  label_smoothing=0.0, rel_context=5, **kw)
    return TransformerDecoder(D, V, o)


DECODERS = {"lstm": _lstm, "transformer": _transformer}


def _sharpen(dec):
    """Random init gives near-uniform outputs; scale the output layer so searches are not tie-bound."""
    with torch.no_grad():
        dec.out.weight.mul_(8.0)
        dec.out.bias.mul_(8.0)
    return dec.eval()


# ---------------------------------------------------------------------------- weight feedback


def test_weight_feedback_term_follows_eqs_2_3():
    torch.manual_seed(0)
    att = MlpAttention(s_dim=5, h_dim=4, att_dim=6, weight_feedback=True)
    h = torch.randn(2, 7, 4)
    mask = torch.ones(2, 7, dtype=torch.bool)
    mask[1, 5:] = False
    s = torch.randn(2, 3, 5)  # K = 3 queries per utterance
    cum = torch.rand(2, 3, 7)
    pre = att.precompute(h)
    e, alpha, ctx = att(s, h, pre, cum, mask)
    # e_{i,t} = v_e^T tanh(W_s s_i + W_h h_t + b + w_beta beta_{i,t}),  beta_{i,t} = sigmoid(v_beta^T h_t) sum_{k<i} alpha_k,t
    beta = torch.sigmoid(h @ att.v_beta.weight[0])[:, None, :] * cum
    x = (s @ att.w_s.weight.T)[:, :, None] + (h @ att.w_h.weight.T + att.w_h.bias)[:, None] \
        + beta[..., None] * att.w_beta.weight[:, 0]
    manual = (torch.tanh(x) @ att.v_e.weight[0]).masked_fill(~mask[:, None], float("-inf"))
    torch.testing.assert_close(e, manual)
    torch.testing.assert_close(alpha, torch.softmax(manual, -1))
    torch.testing.assert_close(ctx, alpha @ h)
    assert bool((alpha[1, :, 5:] == 0).all())
    # no history (first step): the feedback term vanishes; with history it moves the energies
    e0, _, _ = att(s, h, pre, torch.zeros_like(cum), mask)
    nofb = MlpAttention(5, 4, 6, weight_feedback=False)
    nofb.load_state_dict({k: v for k, v in att.state_dict().items() if k in nofb.state_dict()})
    e_nofb, _, _ = nofb(s, h, nofb.precompute(h), cum, mask)
    torch.testing.assert_close(e0, e_nofb)
    assert not torch.allclose(e[mask[:, None].expand_as(e)], e_nofb[mask[:, None].expand_as(e)])


def test_decoder_accumulates_attention_weights():
    dec = _lstm().eval()
    enc = _enc([10, 6])
    static = dec.init_static(enc)
    dyn = dec.init_dynamic(static, 1)
    with dec.recording() as rec:
        for tok in ([0, 0], [3, 4], [5, 1]):
            _, dyn = dec.step(static, dyn, torch.tensor(tok), 1)
    total = sum(w[:, 0] for _, w in rec)
    torch.testing.assert_close(dyn["cum"], total)
    assert len(rec) == 3 and rec[0][0].shape == (2, 1, 10)


# ------------------------------------------------------------------------------------ search


@pytest.mark.parametrize("kind", ["lstm", "transformer"])
def test_beam_one_equals_greedy(kind):
    torch.manual_seed(1)
    dec = _sharpen(DECODERS[kind]())
    enc = _enc([14, 9, 5, 12], seed=3)
    greedy = greedy_search(dec, enc, max_len_ratio=1.0)
    hyps = beam_search(dec, enc, beam=1, opts=SearchOptions(length_norm=True, end_detect=True))
    assert [h[0].tokens for h in hyps] == greedy
    assert any(len(g) > 1 for g in greedy)


@pytest.mark.parametrize("kind,ctc_weight", [("lstm", 0.0), ("lstm", 0.4), ("transformer", 0.0), ("transformer", 0.4)])
def test_batch_of_one_equals_batch_of_n_beam_search(kind, ctc_weight):
    torch.manual_seed(2)
    dec = _sharpen(DECODERS[kind]())
    enc = _enc([14, 9, 5, 12], seed=4)
    opts = SearchOptions(ctc_weight=ctc_weight, pre_beam=1.5)
    full = beam_search(dec, enc, beam=4, opts=opts)
    for i in range(4):
        one = beam_search(dec, _slice(enc, i), beam=4, opts=opts)[0]
        assert [h.tokens for h in one] == [h.tokens for h in full[i]]
        assert [h.score for h in one] == pytest.approx([h.score for h in full[i]], abs=1e-4)
        assert one == sorted(one, key=lambda h: -h.norm_score)


def _ctc_prefix_prob_bruteforce(log_probs, prefix, full=False):
    """Sum over all frame labelings whose collapsed label sequence starts with (or, full: equals) prefix."""
    T, Vc = log_probs.shape
    total = 0.0
    for path in itertools.product(range(Vc), repeat=T):
        out, last = [], None
        for p in path:
            if p != 0 and p != last:
                out.append(p)
            last = p
        if (out == prefix) if full else (out[:len(prefix)] == prefix):
            total += math.exp(sum(float(log_probs[t, p]) for t, p in enumerate(path)))
    return total


def test_ctc_prefix_scores_are_exact():
    torch.manual_seed(0)
    T, Vc = 5, 3
    lp = torch.log_softmax(torch.randn(1, T, Vc), -1)
    sc = CtcPrefixScorer(lp, torch.tensor([T]), torch.zeros(1, dtype=torch.long))
    st = sc.init_state()
    cand = torch.tensor([[1, 2, EOS]])
    chain = [1, 1, 2]  # prefixes [], [1], [1, 1], [1, 1, 2]
    for k in range(len(chain) + 1):
        prefix = chain[:k]
        psi, r_n, r_b = sc.score(st, cand)
        for j, c in enumerate(cand[0].tolist()):
            if c == EOS:
                expect = _ctc_prefix_prob_bruteforce(lp[0], prefix, full=True)
            else:
                expect = _ctc_prefix_prob_bruteforce(lp[0], prefix + [c])
            assert math.exp(float(psi[0, j])) == pytest.approx(expect, rel=1e-4, abs=1e-9), (prefix, c)
        if k < len(chain):
            nxt = chain[k]
            j = cand[0].tolist().index(nxt)
            st = CtcPrefixScorer.select(psi, r_n, r_b, torch.tensor([0]), torch.tensor([j]), torch.tensor([nxt]))
    # <eos> after the full sequence equals torch's CTC loss
    st = sc.init_state()
    for tok in (2, 1):
        psi, r_n, r_b = sc.score(st, torch.tensor([[tok, EOS]]))
        st = CtcPrefixScorer.select(psi, r_n, r_b, torch.tensor([0]), torch.tensor([0]), torch.tensor([tok]))
    psi, _, _ = sc.score(st, torch.tensor([[EOS]]))
    nll = F.ctc_loss(lp.transpose(0, 1), torch.tensor([[2, 1]]), torch.tensor([T]), torch.tensor([2]), reduction="sum")
    assert float(psi[0, 0]) == pytest.approx(-float(nll), abs=1e-5)


def test_max_length_ends_hypotheses():
    dec = _sharpen(_lstm())
    with torch.no_grad():
        dec.out.bias[EOS] = -1e4  # never ends by itself
    enc = _enc([6, 3])
    hyps = beam_search(dec, enc, beam=3, opts=SearchOptions(max_len_ratio=0.5))
    assert [len(h[0].tokens) for h in hyps] == [3, 2]  # ceil(0.5 x frames)


# --------------------------------------------------------------------------------- training


def _toy_task(n=6, D=12, seed=0):
    g = torch.Generator().manual_seed(seed)
    lens = [int(x) for x in torch.randint(8, 15, (n,), generator=g)]
    enc = _enc(lens, D=D, seed=seed)
    targets = [torch.randint(1, V, (int(torch.randint(2, 6, (1,), generator=g)),), generator=g).tolist() for _ in range(n)]
    batch = {"targets": torch.tensor([t for ts in targets for t in ts]), "target_lens": torch.tensor([len(t) for t in targets])}
    return enc, batch, targets


@pytest.mark.parametrize("kind", ["lstm", "transformer"])
def test_decoder_overfits_a_toy_task(kind):
    torch.manual_seed(0)
    dec = DECODERS[kind]()
    enc, batch, targets = _toy_task()
    opt = torch.optim.Adam(dec.parameters(), lr=0.01)
    first = last = None
    for step in range(300):
        loss = dec.loss(enc, batch)
        last = float(loss.detach())
        first = first if first is not None else last
        if last < 0.01 * first:
            break
        opt.zero_grad()
        loss.backward()
        opt.step()
    # spread (issue 57; Xeon family 6 model 85 without AMX, torch seeds 0-3 for the weights, 1 and 2
    # threads): below 1 % of the first loss at step 38-40 (LSTM) and 33-36 (Transformer) of the 300
    # allowed, the same step at 1 and 2 threads; beam 3 and greedy recovered every target in all 16 runs;
    # the same 16 steps and recoveries on an AMD EPYC Zen 3 (family 25 model 1, AVX2 only; 2026-11-30)
    assert last < 0.01 * first, (first, last, step)
    dec.eval()
    assert [h[0].tokens for h in beam_search(dec, enc, beam=3)] == targets
    assert greedy_search(dec, enc) == targets


def test_transformer_incremental_steps_equal_teacher_forcing():
    torch.manual_seed(0)
    dec = _transformer().eval()
    enc = _enc([10, 7])
    ys_in = torch.tensor([[0, 3, 4, 5], [0, 1, 2, 0]])
    full = torch.log_softmax(dec.teacher_logits(enc, ys_in), -1)
    static = dec.init_static(enc)
    dyn = dec.init_dynamic(static, 1)
    for i in range(4):
        lp, dyn = dec.step(static, dyn, ys_in[:, i], 1)
        torch.testing.assert_close(lp, full[:, i], atol=1e-5, rtol=1e-5)


def test_loss_is_label_smoothed_cross_entropy_per_utterance():
    dec = _lstm()
    ys_in, ys_out = dec.split_targets(torch.tensor([4, 5, 6, 7, 8]), torch.tensor([3, 2]))
    assert ys_in.tolist() == [[0, 4, 5, 6], [0, 7, 8, 0]]
    assert ys_out.tolist() == [[4, 5, 6, 0], [7, 8, 0, -100]]
    enc = _enc([10, 7])
    batch = {"targets": torch.tensor([4, 5, 6, 7, 8]), "target_lens": torch.tensor([3, 2])}
    logits = dec.teacher_logits(enc, ys_in)
    dec.opts.label_smoothing = 0.1
    expect = F.cross_entropy(logits.reshape(-1, V), ys_out.reshape(-1), ignore_index=-100, label_smoothing=0.1,
                             reduction="sum") / 2
    torch.testing.assert_close(dec.loss(enc, batch), expect)


# ---------------------------------------------------------------------------- models / config


def _model_cfg(*extra):
    return load_config(None, ["encoder.type=gated_conv", "encoder.d_model=16", "encoder.n_layers=3",
                              "encoder.dropout=0.0", "encoder.pos_enc=sinpos", "features.n_mels=16", "frontend.stride=8",
                              "encoder.options={kernel: 3, frontend_channels: 4}", "decoder.ctc_weight=0.3",
                              "decode.method=attention", "decode.beam=3", *extra])


@pytest.mark.parametrize("enc_type,dec_type", [("gated_conv", "lstm"), ("transformer", "transformer")])
def test_asr_model_with_decoder(enc_type, dec_type):
    extra = [f"decoder.type={dec_type}"]
    if dec_type == "lstm":
        extra.append("decoder.options={units: 16, embed_dim: 8, att_dim: 8, readout_dim: 16}")
    else:  # CAPE C.5: CTC Transformer encoder + Transformer decoder (tiny)
        extra.append("decoder.options={d_model: 16, n_layers: 2, n_heads: 4, d_ff: 32}")
    if enc_type == "transformer":
        extra += ["encoder.type=transformer", "encoder.d_ff=32", "encoder.n_heads=4", "encoder.layer_drop=0.0",
                  "encoder.options={}", "frontend.stride=3"]
    cfg = _model_cfg(*extra)
    m = build_model(cfg, V).train()
    T = 64
    lens = torch.tensor([64, 40])
    feats = torch.randn(2, T, 16) * (torch.arange(T)[None, :, None] < lens[:, None, None])
    batch = {"feats": feats, "feat_lens": lens, "times": torch.arange(T).float()[None].expand(2, -1) * 0.01,
             "targets": torch.tensor([1, 2, 3, 4, 5]), "target_lens": torch.tensor([3, 2])}
    out = m(batch)
    torch.testing.assert_close(out["loss"], 0.3 * out["ctc_loss"] + 0.7 * out["att_loss"])
    out["loss"].backward()
    assert all(p.grad is not None for p in m.parameters())
    m.eval()
    enc = m.encode(feats, lens, batch["times"])
    hyps = AttentionBeam(m, cfg, None).tokens(enc)
    assert len(hyps) == 2 and all(0 not in h for h in hyps)


@pytest.mark.parametrize("override,needle", [
    ("decoder.options={unitz: 3}", "decoder.options.unitz"),
    ("decoder.options={readout_dim: 7}", "readout_dim=7"),
    ("decoder.options={search_ctc_weight: 2}", "search_ctc_weight=2"),
    ("decoder.ctc_weight=1.0", "decoder.ctc_weight=1.0.*never train"),
])
def test_bad_decoder_options_name_the_key(override, needle):
    with pytest.raises(ConfigError, match=needle):
        _model_cfg("decoder.type=lstm", override)


def test_attention_decoding_needs_a_decoder():
    with pytest.raises(ConfigError, match="decode.method=attention needs an attention decoder"):
        _model_cfg()
    with pytest.raises(ConfigError, match="decoder.options.*decoder.type=none"):
        load_config(None, ["decoder.options={units: 3}"])


def test_attention_maps_for_analysis(tmp_path):
    from asrkit.reports.analysis import attention_maps, plot_attention

    cfg = _model_cfg("decoder.type=lstm", "decoder.options={units: 16, embed_dim: 8, att_dim: 8, readout_dim: 16}")
    m = build_model(cfg, V).eval()
    T = 80
    batch = {"feats": torch.randn(1, T, 16), "feat_lens": torch.tensor([T]),
             "times": torch.arange(T).float()[None] * 0.01, "targets": torch.tensor([1, 2, 3]),
             "target_lens": torch.tensor([3])}
    energies, weights, hyp = attention_maps(m, batch)
    assert energies.shape == (4, 10)  # <sos> + 3 reference tokens; 80 frames / 8
    assert weights.shape[1] == 10 and weights.shape[0] == min(len(hyp) + 1, 10)
    torch.testing.assert_close(weights.sum(1), torch.ones(weights.shape[0]))
    plot_attention(energies, weights, tmp_path / "att.png", title="t")
    assert (tmp_path / "att.png").read_bytes()[:4] == b"\x89PNG"


def test_decode_ctc_weight_overrides_the_models_search_weight():
    """``decode.ctc_weight`` (decode time) replaces the model's ``search_ctc_weight``; -1 keeps it."""
    import dataclasses

    from asrkit.config import ConfigError
    from asrkit.training.checks import load_config

    torch.manual_seed(2)
    dec = _sharpen(_lstm())
    enc = _enc([14, 9, 5, 12], seed=4)
    got = {}
    for w in (0.0, 0.7):
        cfg = load_config(None, ["decode.beam=4", f"decode.ctc_weight={w}"])
        want = beam_search(dec, enc, beam=4, opts=dataclasses.replace(dec.search, ctc_weight=w))
        got[w] = AttentionBeam(types.SimpleNamespace(decoder=dec), cfg, None).tokens(enc)
        assert got[w] == [h[0].tokens for h in want]
    assert got[0.0] != got[0.7]  # the weight matters on this input: the override is not a no-op
    cfg = load_config(None, ["decode.beam=4"])  # default -1: the model's own weight (0 here)
    assert cfg.decode.ctc_weight == -1.0 and AttentionBeam(types.SimpleNamespace(decoder=dec), cfg, None).tokens(enc) == got[0.0]
    with pytest.raises(ConfigError, match="decode.ctc_weight=1.5"):
        load_config(None, ["decode.ctc_weight=1.5"])


def test_transformer_decoder_layer_drop_follows_the_step_seed():
    """Like the encoder's: the layers dropped in a training step depend only on the step seed
    (identical on every DDP rank and after a resume), not on the global RNG; eval drops none. A
    dropped layer still runs (DDP needs its parameters in the graph) but gets zero gradients."""
    o = TransformerDecoderOptions(d_model=16, n_layers=8, n_heads=4, d_ff=32, dropout=0.0, layer_drop=0.5,
                                  label_smoothing=0.0, rel_context=5)
    dec = TransformerDecoder(12, V, o)
    enc = _enc([9, 7])
    batch = {"targets": torch.tensor([1, 2, 3, 4]), "target_lens": torch.tensor([2, 2])}

    def dropped(seed: int, rng: int) -> list[int]:
        torch.manual_seed(rng)  # the global RNG must not matter
        dec.train()
        dec.zero_grad()
        dec.set_step(seed)
        dec.loss(enc, batch).backward()
        return [i for i, layer in enumerate(dec.layers)
                if all(p.grad is None or not p.grad.any() for p in layer.parameters())]

    runs = {s: dropped(s, rng=s + 100) for s in range(12)}
    assert all(dropped(s, rng=7) == runs[s] for s in range(12))  # the step seed alone decides
    assert len({tuple(r) for r in runs.values()}) > 1 and 0 < sum(map(len, runs.values())) < 12 * 8
    dec.eval()
    dec.zero_grad()
    dec.loss(enc, batch).backward()
    assert all(p.grad is not None and p.grad.any() for p in dec.layers.parameters())
