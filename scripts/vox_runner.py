"""Time vox-tts inside its own venv (run by scripts/bench.py --peers).

    .cache/vox-venv/bin/python scripts/vox_runner.py spec.json [out.json]     (no out.json: stdout)

spec.json: {"tmod", "warmup_frames", "single": [{"text", "speaker", "frames"}], "items": [...],
"concurrency"}. Greedy: top_k=1, sub_top_k=1 (argmax in talker and code predictor; the audio no
longer depends on the seed). Output: time.time() stamps t_top, t_imports, t_load, t_end; version;
threads; single: [{frames, made_frames, wall}]; items: {wall, frames, made_frames, count}.
"""

import time

T_TOP = time.time()

import json  # noqa: E402
import sys  # noqa: E402
from concurrent.futures import ThreadPoolExecutor  # noqa: E402

GREEDY = {"top_k": 1, "sub_top_k": 1, "seed": 0}
SAMPLES_PER_FRAME = 1920


def main(argv) -> int:
    spec = json.loads(open(argv[0]).read())
    import vox

    out = {"t_top": T_TOP, "t_imports": time.time(), "version": vox.__version__}
    engine = vox.Engine(spec["tmod"], device="cpu")
    out["t_load"] = time.time()
    voices = {}

    def voice(name):
        if name not in voices:
            voices[name] = engine.speaker_voice(name)
        return voices[name]

    def made(item) -> float:
        audio = engine.synthesize(item["text"], voice(item["speaker"]), language="english",
                                  max_frames=item["frames"], **GREEDY)
        return int(audio.size // SAMPLES_PER_FRAME)

    first = (spec.get("single") or spec["items"])[0]
    if spec.get("warmup_frames"):
        made({**first, "frames": spec["warmup_frames"]})
    out["single"] = []
    for item in spec.get("single", []):
        started = time.perf_counter()
        frames = made(item)
        out["single"].append({"frames": item["frames"], "made_frames": frames, "wall": time.perf_counter() - started})
    items = spec.get("items", [])
    for item in items:
        voice(item["speaker"])
    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=max(1, min(spec.get("concurrency", 1), len(items) or 1))) as pool:
        frames = list(pool.map(made, items))
    out["items"] = {"wall": time.perf_counter() - started, "frames": sum(i["frames"] for i in items),
                    "made_frames": sum(frames), "count": len(items)}
    out["threads"] = engine.info.get("plan", {}).get("threads")
    out["t_end"] = time.time()
    text = json.dumps(out, indent=1)
    if len(argv) > 1:
        with open(argv[1], "w") as f:
            f.write(text)
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
