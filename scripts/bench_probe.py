"""Child processes of scripts/bench.py that time omnitts from process start, with phase stamps.

    python scripts/bench_probe.py first-frame CKPT DTYPE TEXT SPEAKER
        load with omnitts.load(CKPT, dtype=DTYPE), prepare one request, step the engine until its first
        frame's codes are on the host; print one JSON line of time.time() stamps: t_top (first line of
        this file), t_imports (torch + omnitts imported), t_load, t_first.
    python scripts/bench_probe.py synth ARGS...
        exactly `omnitts synth ARGS...` (the same entry point as the console script); the stamps
        t_top, t_imports, t_load (the checkpoint load inside the command returned) and t_end go to the
        JSON file named by $OMNITTS_BENCH_STAMPS.

The parent takes its own time.time() just before Popen, so interpreter start-up is counted too.
"""

import time

T_TOP = time.time()

import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402


def first_frame(ckpt: str, dtype: str, text: str, speaker: str) -> dict:
    import torch  # noqa: F401

    import omnitts
    from omnitts.engine import Engine, plan
    from omnitts.request import Request

    stamps = {"t_top": T_TOP, "t_imports": time.time()}
    tts = omnitts.load(ckpt, dtype=dtype, max_batch=1)
    stamps["t_load"] = time.time()
    request = Request(text, "english", speaker, id="first")
    prompt = tts.prepare(request)
    params = tts.default_params(True, max_frames=2).with_budget(prompt.text_tokens)
    engine = Engine(tts.ckpt, plan(tts.ckpt, prompt.embeds.shape[0] + params.max_frames + 1, 1,
                                   prompt.trailing.shape[0], tts.kv_budget_bytes))
    engine.add(prompt, params)
    engine.step()  # prefill + the first frame, its codes' host copy started
    codes = engine.pending[0].result()  # the first frame, on the host
    stamps["t_first"] = time.time()
    stamps["first_codes"] = [int(c) for c in codes[0]]
    stamps["prompt_positions"] = int(prompt.embeds.shape[0])
    return stamps


def synth(args: list[str]) -> int:
    import omnitts.api
    from omnitts import launch

    stamps = {"t_top": T_TOP, "t_imports": time.time()}
    load = omnitts.api.load

    def timed_load(*a, **k):  # cli.running._run imports load from omnitts.api when it runs, so it gets this
        tts = load(*a, **k)
        stamps["t_load"] = time.time()
        return tts

    omnitts.api.load = timed_load
    sys.argv = ["omnitts", "synth", *args]
    code = 0
    try:
        launch.main()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    stamps["t_end"] = time.time()
    path = os.environ.get("OMNITTS_BENCH_STAMPS")
    if path:
        with open(path, "w") as f:
            json.dump(stamps, f)
    return code


def main(argv) -> int:
    if argv[:1] == ["first-frame"] and len(argv) == 5:
        print(json.dumps(first_frame(*argv[1:])), flush=True)
        return 0
    if argv[:1] == ["synth"]:
        return synth(argv[1:])
    sys.exit(__doc__)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
