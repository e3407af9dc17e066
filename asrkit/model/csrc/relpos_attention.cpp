// Blocked CPU attention with Shaw et al.'s relative-position key bias (asrkit relpos, regular frames).
//
//   out = softmax(q k^T * scale + bias + mask) v,   bias[b, h, i, j] = q[b, h, i] . w[clip(j - i) + M]
//
// (lags beyond +-M: the edge row w[0] / w[2M] (clip), or no bias (zero_beyond)). Same result as
// asrkit.model.attention.attention_qbias with a RelBias of regular frames (tested), computed one
// block of query rows of one (batch, head) at a time, so that every T x T-sized intermediate of a
// block (scores, the block's lag products, dP, dS) stays in the core's cache. Like flash attention,
// nothing T x T is kept for the backward: it recomputes each block's scores (a block holds whole
// rows, so a plain softmax, no log-sum-exp). Measured on the 2-core development VM at T = 1000 and
// 3000, recomputing was as fast as writing the probabilities once and reading them back, and it
// keeps no B x H x T x T buffer. Each block's products are single-threaded GEMMs (ATen's mm inside
// parallel_for; the forward runs blocks in parallel, the backward (batch, head) pairs, whose k, v and
// table gradients accumulate over the blocks). q, k, v may be strided views with contiguous rows.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#if defined(__x86_64__) || defined(_M_X64)
#include <xmmintrin.h>
// Flush-to-zero + denormals-are-zero for one task: subnormal probabilities of far keys would make
// the GEMMs ~100x slower; their share of any output is below float32's resolution.
struct FlushDenormals {
  unsigned int saved;
  FlushDenormals() : saved(_mm_getcsr()) { _mm_setcsr(saved | 0x8040); }
  ~FlushDenormals() { _mm_setcsr(saved); }
};
#else
struct FlushDenormals {};
#endif

namespace {

struct Block {
  int64_t i0, bsz, a, n, r0;  // rows i0 .. i0+bsz-1; table rows r0 .. r0+n-1 are the block's
                              // in-context lags, held in columns 0 .. n-1 of its product buffer
};

// Lags of rows i0 .. i0+bsz-1 against keys 0 .. S-1: lo = -(i0+bsz-1) .. hi = S-1-i0; of these,
// max(-M, lo) .. min(M, hi) have a table row. Column c of a row r's products is the lag lo + a + c.
Block block_of(int64_t i0, int64_t i1, int64_t S, int64_t M) {
  const int64_t lo = -(i1 - 1), hi = S - 1 - i0;
  const int64_t first = std::max(-M, lo), last = std::min(M, hi);
  return Block{i0, i1 - i0, first - lo, last - first + 1, M + first};
}

// Key j of row r reads product column c = j + off(r), off(r) = bsz - 1 - r - a.
inline int64_t col_offset(const Block& bl, int64_t r) { return bl.bsz - 1 - r - bl.a; }

void check(const at::Tensor& t, const char* name, bool contiguous = true) {
  TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == at::kFloat && t.dim() >= 2 &&
                  (contiguous ? t.is_contiguous() : t.stride(-1) == 1),
              "relpos_attention: ", name, " must be a float32 CPU tensor, ",
              contiguous ? "contiguous" : "with contiguous rows");
}

// Whether some keys of the block lie beyond the context on the left (lag < -M) / on the right.
inline bool left_beyond(const Block& bl) { return bl.a > 0; }
inline bool right_beyond(const Block& bl, int64_t S) { return bl.a + bl.n < S + bl.bsz - 1; }

}  // namespace

// Scores of one block, in place in ``sc`` (bsz x S): scale * q_b k^T + bias (+ -inf at masked keys);
// ``prod`` (bsz x n) receives the block's lag products q_b w[r0 .. r0+n-1]^T.
static void block_scores(at::Tensor& sc, at::Tensor& prod, const at::Tensor& qb, const at::Tensor& kb,
                         const at::Tensor& w, const Block& bl, bool zero_beyond, const bool* mk, double scale) {
  const int64_t S = sc.size(1);
  at::mm_out(prod, qb, w.narrow(0, bl.r0, bl.n).t());
  at::addmm_out(sc, sc, qb, kb.t(), /*beta=*/0, /*alpha=*/scale);
  const float* pr = prod.data_ptr<float>();
  float* ps = sc.data_ptr<float>();
  const float ninf = -std::numeric_limits<float>::infinity();
  for (int64_t r = 0; r < bl.bsz; ++r) {
    float* row = ps + r * S;
    const float* prow = pr + r * bl.n;
    const int64_t off = col_offset(bl, r);
    // keys j with column j + off in [0, n): in context; before: left edge; after: right edge
    const int64_t j0 = std::clamp<int64_t>(-off, 0, S), j1 = std::clamp<int64_t>(bl.n - off, 0, S);
    if (!zero_beyond) {
      const float left = prow[0], right = prow[bl.n - 1];
      for (int64_t j = 0; j < j0; ++j) row[j] += left;
      for (int64_t j = j1; j < S; ++j) row[j] += right;
    }
    const float* src = prow + off;
    for (int64_t j = j0; j < j1; ++j) row[j] += src[j];
    if (mk)
      for (int64_t j = 0; j < S; ++j)
        if (!mk[j]) row[j] = ninf;
  }
}

// q, k: B x H x T x Dh, B x H x S x Dh; v: B x H x S x Dv; w: (2M+1) x Dh (scaled table);
// kmask: B x S bool (true = attend) or an empty tensor. Returns out (B x H x T x Dv), all the
// backward needs besides the inputs: it recomputes each block's probabilities (no T x T buffer kept).
at::Tensor relpos_attention_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                 const at::Tensor& w, int64_t M, bool zero_beyond,
                                                 const at::Tensor& kmask, double scale, int64_t block) {
  check(q, "q", false); check(k, "k", false); check(v, "v", false); check(w, "w");
  const int64_t B = q.size(0), H = q.size(1), T = q.size(2), S = k.size(2), Dv = v.size(3);
  TORCH_CHECK(w.size(0) == 2 * M + 1, "relpos_attention: table rows ", w.size(0), " != 2M+1 = ", 2 * M + 1);
  const bool masked = kmask.defined() && kmask.numel() > 0;
  at::Tensor km = masked ? kmask.to(at::kBool).contiguous() : kmask;
  at::Tensor out = at::empty({B, H, T, Dv}, q.options());
  const int64_t nblk = (T + block - 1) / block;
  at::parallel_for(0, B * H * nblk, 1, [&](int64_t begin, int64_t end) {
    FlushDenormals ftz;
    at::NoGradGuard no_grad;  // grad mode is per thread: the worker threads' own
    at::Tensor prod, sc;  // the block's lag products (bsz x n) and scores (bsz x S), reused
    for (int64_t task = begin; task < end; ++task) {
      const int64_t bh = task / nblk, ib = task % nblk, b = bh / H, h = bh % H;
      const int64_t i0 = ib * block, i1 = std::min(T, i0 + block);
      const Block bl = block_of(i0, i1, S, M);
      if (!prod.defined() || prod.size(0) != bl.bsz || prod.size(1) != bl.n) prod = at::empty({bl.bsz, bl.n}, q.options());
      if (!sc.defined() || sc.size(0) != bl.bsz) sc = at::empty({bl.bsz, S}, q.options());
      block_scores(sc, prod, q[b][h].narrow(0, i0, bl.bsz), k[b][h], w, bl, zero_beyond,
                   masked ? km[b].data_ptr<bool>() : nullptr, scale);
      at::_softmax_out(sc, sc, 1, false);  // probabilities (rows are whole: every key is in the block)
      at::Tensor ob = out[b][h].narrow(0, i0, bl.bsz);
      at::mm_out(ob, sc, v[b][h]);
    }
  });
  return out;
}

// grad: B x H x T x Dv (contiguous); out: from the forward. The probabilities of each block are
// recomputed from q, k, w (its rows are whole, so a softmax: no log-sum-exp to keep). Returns {gq, gk, gv, gw}.
std::vector<at::Tensor> relpos_attention_backward(const at::Tensor& grad, const at::Tensor& q, const at::Tensor& k,
                                                  const at::Tensor& v, const at::Tensor& w, const at::Tensor& out, int64_t M, bool zero_beyond,
                                                  const at::Tensor& kmask, double scale, int64_t block) {
  check(grad, "grad"); check(q, "q", false); check(k, "k", false); check(v, "v", false); check(w, "w"); check(out, "out");
  const int64_t B = q.size(0), H = q.size(1), T = q.size(2), S = k.size(2), Dh = q.size(3);
  const bool masked = kmask.defined() && kmask.numel() > 0;
  at::Tensor km = masked ? kmask.to(at::kBool).contiguous() : kmask;
  at::Tensor gq = at::empty(q.sizes(), q.options()), gk = at::zeros(k.sizes(), k.options()),
             gv = at::zeros(v.sizes(), v.options());
  // the table's gradient: one partial sum per thread (not per (batch, head): B x H tables would be
  // tens of MB for a large batch), added up at the end
  at::Tensor gw_parts = at::zeros({at::get_num_threads(), w.size(0), Dh}, q.options());
  at::Tensor delta = (grad * out).sum(-1);  // B x H x T: rowsum(P * dP) = dO . O
  at::parallel_for(0, B * H, 1, [&](int64_t begin, int64_t end) {
    FlushDenormals ftz;
    at::NoGradGuard no_grad;  // grad mode is per thread: the worker threads' own
    at::Tensor prod, pb, ds, g;  // per block: lag products, probabilities, dS (bsz x S), dS by lag (bsz x n)
    for (int64_t bh = begin; bh < end; ++bh) {
      const int64_t b = bh / H, h = bh % H;
      at::Tensor kb = k[b][h], vb = v[b][h], gkb = gk[b][h], gvb = gv[b][h];
      at::Tensor gwb = gw_parts[at::get_thread_num()];
      const float* dl = delta[b][h].data_ptr<float>();
      const bool* mk = masked ? km[b].data_ptr<bool>() : nullptr;
      for (int64_t i0 = 0; i0 < T; i0 += block) {
        const int64_t i1 = std::min(T, i0 + block);
        const Block bl = block_of(i0, i1, S, M);
        at::Tensor gb = grad[b][h].narrow(0, i0, bl.bsz);
        at::Tensor qb = q[b][h].narrow(0, i0, bl.bsz), gqb = gq[b][h].narrow(0, i0, bl.bsz);
        if (!prod.defined() || prod.size(0) != bl.bsz || prod.size(1) != bl.n) {
          prod = at::empty({bl.bsz, bl.n}, q.options());
          g = at::empty({bl.bsz, bl.n}, q.options());
        }
        if (!ds.defined() || ds.size(0) != bl.bsz) {
          pb = at::empty({bl.bsz, S}, q.options());
          ds = at::empty({bl.bsz, S}, q.options());
        }
        block_scores(pb, prod, qb, kb, w, bl, zero_beyond, mk, scale);  // the forward's probabilities, again
        at::_softmax_out(pb, pb, 1, false);
        gvb.addmm_(pb.t(), gb);
        at::mm_out(ds, gb, vb.t());  // dP
        float* d = ds.data_ptr<float>();
        float* gg = g.data_ptr<float>();
        const float* pp = pb.data_ptr<float>();
        const bool edges = left_beyond(bl) || right_beyond(bl, S);
        std::vector<float> eleft(bl.bsz, 0.f), eright(bl.bsz, 0.f);
        for (int64_t r = 0; r < bl.bsz; ++r) {
          float* drow = d + r * S;
          const float* prow = pp + r * S;
          const float dr = dl[i0 + r];
          for (int64_t j = 0; j < S; ++j) drow[j] = prow[j] * (drow[j] - dr);  // dS
          // the bias's gradient per lag column: column c of row r sums key j = c - off
          const int64_t off = col_offset(bl, r);
          const int64_t j0 = std::clamp<int64_t>(-off, 0, S), j1 = std::clamp<int64_t>(bl.n - off, 0, S);
          float* grow = gg + r * bl.n;
          std::fill(grow, grow + bl.n, 0.f);
          for (int64_t j = j0; j < j1; ++j) grow[j + off] = drow[j];
          if (!zero_beyond && edges) {
            float sl = 0.f, sr = 0.f;
            for (int64_t j = 0; j < j0; ++j) sl += drow[j];
            for (int64_t j = j1; j < S; ++j) sr += drow[j];
            eleft[r] = sl; eright[r] = sr;
          }
        }
        gkb.addmm_(ds.t(), qb, 1, scale);
        at::addmm_out(gqb, gqb, ds, kb, /*beta=*/0, /*alpha=*/scale);
        at::Tensor wb = w.narrow(0, bl.r0, bl.n);
        gqb.addmm_(g, wb);
        gwb.narrow(0, bl.r0, bl.n).addmm_(g.t(), qb);
        if (!zero_beyond && edges) {  // clipped lags: their gradient goes to the edge rows
          at::Tensor el = at::from_blob(eleft.data(), {bl.bsz}, q.options());
          at::Tensor er = at::from_blob(eright.data(), {bl.bsz}, q.options());
          gqb.addr_(el, w[bl.r0]).addr_(er, w[bl.r0 + bl.n - 1]);
          gwb[bl.r0].add_(at::mv(qb.t(), el));
          gwb[bl.r0 + bl.n - 1].add_(at::mv(qb.t(), er));
        }
      }
    }
  });
  return {gq, gk, gv, gw_parts.sum(0)};
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("forward", &relpos_attention_forward, "relpos attention, forward (CPU, blocked)");
  m.def("backward", &relpos_attention_backward, "relpos attention, backward (CPU, blocked)");
}
