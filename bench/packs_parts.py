"""bench.packs's sides in parts: a side too long for one sitting (the GPU sweep job after job, 8 runs of the GPU
demo, against a lent machine's 10-minute calls) runs as parts, each a `train.py -m` of a sub-sweep, and counts once
every part is there. Here: what a part is and its folder's name, how the sweep is cut (the first swept key's values),
the check that a pack side's part holds packs that the launcher forms for the whole sweep, where a part ran (the
device, the machine, the compilation caches it found), the sum of the parts, and a side's parts written back from
its result line (--restore), and the report's lines on where the parts ran.
bench/packs.py runs the parts and reads them back; this module keeps that one under 500 lines.
"""

from __future__ import annotations

import getpass
import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bench.common import REPO, machine
from bench.host_speed import host_speed

FOLDER = re.compile(r"(?P<side>.+?)-(?P<repeat>\d+)(?:-part(?P<k>\d+)of(?P<m>\d+))?")  # Part.folder's names
COMMIT_ENV = "RLFT_COMMIT"  # the commit a part ran at, where the machine's git does not know it (the lent GPU machine)


@dataclass(frozen=True)
class Part:
    """Part k of m of a side's sweep; 1 of 1 is the whole side."""

    k: int = 1
    m: int = 1

    def __str__(self) -> str:
        return f"{self.k}/{self.m}"

    def folder(self, side: str, repeat: int) -> str:
        return f"{side}-{repeat}" if self.m == 1 else f"{side}-{repeat}-part{self.k}of{self.m}"


def parse_part(text: str) -> Part:
    k, sep, m = text.partition("/")
    if not (sep and k.isdigit() and m.isdigit() and 1 <= int(k) <= int(m)):
        raise SystemExit(f"--part {text}: give K/M with 1 <= K <= M, e.g. --part 2/4 (the second of four parts)")
    return Part(int(k), int(m))


def cut_sweep(
    swept: list[str], listed: list[list[str]], part: Part, list_jobs: Callable[[list[str]], list[list[str]] | None]
) -> tuple[list[str], list[int]]:
    """Part k of m of the sweep `swept` (whose jobs are `listed`): its sweep overrides and the whole sweep's numbers of
    its jobs, in the order `list_jobs` (Hydra's listing of a sweep) gives them. The first swept key's values are cut
    into m runs of equal length in their order, each with every value of the other keys; where m is a multiple of
    that key's values instead, each value's jobs are cut so by the next key (m = 8 over 4 learning rates x 2 seeds:
    one job a part, which a slow machine's 10-minute call can hold where two solo runs may not). Hydra lists the
    first key slowest, so a part's jobs are consecutive jobs of the whole sweep, and its labels the whole sweep's."""
    if part.m == 1:
        return swept, list(range(len(listed)))
    sub, chosen = _cut(swept, listed, part.k - 1, part.m, part)
    number = {tuple(job): i for i, job in enumerate(listed)}
    numbers = [number.get(tuple(job), -1) for job in list_jobs(sub) or []]
    mine = [i for i, job in enumerate(listed) if all({f"{k}={v}" for v in vs} & set(job) for k, vs in chosen.items())]
    if numbers != mine:
        raise SystemExit(f"--part {part}: the sub-sweep {' '.join(sub)} lists other jobs than the whole sweep's")
    return sub, numbers


def _values(key: str, listed: list[list[str]]) -> list[str]:
    return list(dict.fromkeys(o.split("=", 1)[1] for job in listed for o in job if o.split("=", 1)[0] == key))


def _counts(swept: list[str], listed: list[list[str]]) -> list[int]:
    """Every number of parts `_cut` can cut the sweep `swept` into."""
    if not swept:
        return [1]
    key = swept[0].split("=", 1)[0]
    values = _values(key, listed)
    mates = [job for job in listed if f"{key}={values[0]}" in job]
    return sorted(
        {d for d in range(1, len(values) + 1) if len(values) % d == 0}
        | {len(values) * q for q in _counts(swept[1:], mates)}
    )


def _cut(
    swept: list[str], listed: list[list[str]], index: int, m: int, part: Part
) -> tuple[list[str], dict[str, list[str]]]:
    """Part `index` (from 0) of m of `swept`: its overrides and, per key it cuts, the values the part keeps."""
    key = swept[0].split("=", 1)[0]
    values = _values(key, listed)
    if len(values) % m == 0:
        per = len(values) // m
        chunk = values[index * per : (index + 1) * per]
        return [f"{key}={','.join(chunk)}", *swept[1:]], {key: chunk}
    if m % len(values) == 0 and m // len(values) in _counts(swept[1:], listed):
        q = m // len(values)
        value = values[index // q]
        sub, chosen = _cut(swept[1:], [job for job in listed if f"{key}={value}" in job], index % q, q, part)
        return [f"{key}={value}", *sub], {key: [value], **chosen}
    fits = ", ".join(str(d) for d in _counts(swept, listed))
    raise SystemExit(
        f"--part {part}: the swept key {key} has {len(values)} values, which {m} parts cannot share evenly; give M "
        f"in {fits}, or sweep another key first"
    )


def check_whole_packs(listed: list[list[str]], side: str, max_jobs: int, numbers: list[int]) -> None:
    """A pack side's part (the jobs `numbers` of the sweep `listed`) must run packs that the launcher forms for the
    whole sweep (rl/pack.py split over the jobs' typed configs), so that the parts together do the whole side's work
    in the same packs; refused in one line otherwise."""
    from rl.config.schema import TrainConfig, register_configs
    from rl.entry import compose_checked
    from rl.pack import split

    register_configs()  # what train.py does at import: the schema Hydra composes the jobs against
    conf = str(REPO / "conf")
    typed = [compose_checked(conf, "train", job, TrainConfig, f"sweep job #{i}: ")[1] for i, job in enumerate(listed)]
    whole = sorted(split(typed, max_jobs)[0])
    mine = sorted([numbers[i] for i in pack] for pack in split([typed[n] for n in numbers], max_jobs)[0])
    if mine != [pack for pack in whole if set(pack) <= set(numbers)]:
        raise SystemExit(
            f"{side}: this part's jobs would run as packs {mine}, the whole side's are {whole}: a part must hold whole "
            f"packs of the launcher; give fewer parts or run {side} whole"
        )


def device_of(info: dict) -> str:
    """The device a machine() record names: its GPU, else "cpu"."""
    return info.get("gpu") or "cpu"


def where_run() -> dict:
    """This machine (bench.common machine()) and its speed (host_speed), its commit $RLFT_COMMIT where that is set:
    the lent GPU machine's copy of the working tree may sit in a git checkout of another commit (there, the last
    landed one), not what ran."""
    info = machine()
    info["commit"] = os.environ.get(COMMIT_ENV) or info["commit"]
    info["speed"] = host_speed(cuda="gpu" in info)
    return info


def caches_here() -> list[str]:
    """The compilation caches this machine holds before a side starts (vLLM's, Triton's, Inductor's, Unsloth's): a
    fresh machine compiles on its first run, which a part pays on every fresh machine and a whole side once."""
    home = Path.home()
    folders = {
        "vllm": home / ".cache" / "vllm",
        "triton": home / ".triton" / "cache",
        "inductor": Path(f"/tmp/torchinductor_{getpass.getuser()}"),
        "unsloth": REPO / "unsloth_compiled_cache",
    }
    return [name for name, folder in folders.items() if folder.is_dir() and any(folder.iterdir())]


class Incomplete(Exception):
    """A side not whole under --out yet (a part missing, or one that did not finish): one line saying which."""


def label(result: dict) -> str:
    part = result.get("part", "1/1")
    return f"{result['side']} repeat {result['repeat']}" + (f" part {part}" if "/" in part and part != "1/1" else "")


def one_device(named: list[tuple[str, str | None]]) -> None:
    """Refuse, in one line naming both, results (or this machine) of two devices: timings compare on one card kind."""
    first, device = named[0]
    for name, other in named[1:]:
        if other != device:
            raise SystemExit(
                f"{first} ran on {device}, {name} on {other}: timings compare on one card kind only; run it on "
                f"{device} or use another --out"
            )


def check_device_here(out: Path, here: str) -> None:
    """Before anything runs: the results already under --out ran on this machine's device."""
    kept = [json.loads(f.read_text()) for f in sorted(out.glob("*/result.json"))]
    if kept:
        one_device([(label(r), r.get("device") or "an unrecorded device") for r in kept] + [("this machine", here)])


def found_parts(out: Path, side: str, repeat: int) -> dict[Part, Path]:
    """The folders of a side's parts under --out, by part; refused where they are parts of two splits."""
    found = {}
    for folder in out.glob(f"{side}-{repeat}-part*of*"):
        m = FOLDER.fullmatch(folder.name)
        if m and m["k"] and m["side"] == side and int(m["repeat"]) == repeat:
            found[Part(int(m["k"]), int(m["m"]))] = folder
    splits = sorted({p.m for p in found})
    if len(splits) > 1:
        raise SystemExit(f"{out}: {side} repeat {repeat} has parts of {' and of '.join(map(str, splits))}; keep one")
    return found


def job_numbers(part: dict) -> list[int]:
    """The sweep's numbers of a part's jobs (a part's result holds its jobs; an assembled side's parts, their numbers)."""
    return [j if isinstance(j, int) else j["job"] for j in part["jobs"]]


def assemble(parts: list[dict], n_jobs: int) -> dict:
    """A side from the results of its parts, in part order: the wall times and samples added, the jobs in the
    sweep's order; refused where the parts ran on two devices or do not hold each of the `n_jobs` jobs once."""
    one_device([(label(p), p.get("device")) for p in parts])
    jobs = sorted((j for p in parts for j in p["jobs"]), key=lambda j: j["job"])
    if [j["job"] for j in jobs] != list(range(n_jobs)):
        held = [j["job"] for j in jobs]
        raise SystemExit(f"{label(parts[0])}: its parts hold jobs {held}, not each of the sweep's {n_jobs} once")
    samples, wall_s = sum(j["samples"] for j in jobs), round(sum(p["wall_s"] for p in parts), 1)
    return {
        "bench": "packs",
        "side": parts[0]["side"],
        "repeat": parts[0]["repeat"],
        "part": f"sum of {len(parts)}",
        "wall_s": wall_s,
        "samples": samples,
        "samples_per_s": round(samples / wall_s, 3),
        "jobs": jobs,
        "device": parts[0].get("device"),
        "machine": max((p["machine"] for p in parts), key=lambda info: info["date"]),
        "parts": [
            {
                **{k: p.get(k) for k in ("part", "wall_s", "startup_s", "caches", "machine")},
                **({"restored": p["restored"]} if p.get("restored") else {}),
                "jobs": job_numbers(p),
            }
            for p in parts
        ],
    }


def provenance(results: list[dict]) -> str:
    """Where the sides ran: the device, the commits where they differ, the host CPUs, and per side its parts (wall
    times added), each part's start before its first job and the compilation caches it found."""
    lines = [f"device: {results[0].get('device')}"]
    runs = [p for r in results for p in r.get("parts", [r])]
    commits = sorted({p["machine"].get("commit") or "unknown" for p in runs if "machine" in p})
    if len(commits) > 1:
        lines.append(f"commits the sides and parts ran at: {', '.join(commits)}")
    cpus = sorted({p["machine"]["cpu"] for p in runs if "cpu" in p.get("machine", {})})
    if cpus:  # one GPU kind may sit beside several host CPUs, and a small model's roles are bound by their Python
        lines.append(f"host CPUs the sides and parts ran on: {'; '.join(cpus)}")
    lines += speed_lines(results)
    for r in results:
        parts = r.get("parts", [r])
        starts = [p["startup_s"] for p in parts if p.get("startup_s") is not None]
        start = f"{min(starts):.1f}-{max(starts):.1f}" if len(starts) > 1 else "".join(f"{s:.1f}" for s in starts)
        caches = " | ".join(",".join(p.get("caches") or ["none"]) for p in parts)
        seconds = {j["job"]: j.get("job_s") for j in r["jobs"]}
        ran = " | ".join("+".join(f"{seconds[n] or 0:.0f}" for n in job_numbers(p)) for p in parts)
        walls = " + ".join(f"{p['wall_s']:.1f}" for p in parts)
        how = f"{len(parts)} parts, {walls} s" if len(parts) > 1 else "whole"
        restored = sorted({p["restored"] for p in parts if p.get("restored")})
        how += "".join(f"; restored from {where}" for where in restored)
        lines.append(
            f"{label(r)}: {how}; start to first job {start or '-'} s; each job's own s {ran}; "
            f"compilation caches at start: {caches}"
        )
    return "\n".join(lines)


SPEED_APART = 1.15  # parts whose machines' Python speeds differ more than this make a speed-up across them unsure


def speed_lines(results: list[dict]) -> list[str]:
    """Each part's machine speed (bench/host_speed.py, where it was measured) and, where the parts of the sides
    compared ran on machines more than SPEED_APART apart in Python speed, one line saying that their speed-up mixes
    the machines' speeds with the packs' gain."""
    measured = [
        (label_part(r, p), p["machine"]["speed"])
        for r in results
        for p in r.get("parts", [r])
        if (p.get("machine") or {}).get("speed")
    ]
    if not measured:
        return []

    def show(speed: dict) -> str:
        launch = f", launch {speed['launch_us']:.1f} us" if "launch_us" in speed else ""
        return f"python {speed['python_ms']:.0f} ms{launch}"

    lines = [
        "machine speed per part (a fixed Python loop; a tiny CUDA kernel's launch): "
        + "; ".join(f"{where} {show(speed)}" for where, speed in measured)
    ]
    loops = [speed["python_ms"] for _, speed in measured]
    if max(loops) > SPEED_APART * min(loops):
        lines.append(
            f"the parts ran on machines {max(loops) / min(loops):.2f}x apart in Python speed "
            f"({min(loops):.0f}-{max(loops):.0f} ms): a speed-up across them mixes the machines' speeds with the packs' gain"
        )
    return lines


def label_part(result: dict, part: dict) -> str:
    """A part's name in the report: its side and repeat, and its part where the side ran in several."""
    return label({**result, "part": part.get("part", result.get("part", "1/1"))})


def recorded_side(lines: list[str], side: str, same: Callable[[dict], bool]) -> tuple[int, dict] | None:
    """The newest sweep-packs result line (its number from 1, its record) whose runs hold `side` and that `same` takes
    for this workload; None where no line does."""
    for number in range(len(lines), 0, -1):
        text = lines[number - 1].strip()
        if not text:
            continue
        record = json.loads(text)
        if record.get("claim") != "sweep-packs" or not same(record):
            continue
        if any(r.get("side") == side for r in record.get("result", {}).get("runs", [])):
            return number, record
    return None


def restored_parts(run: dict, where: str) -> list[dict]:
    """A recorded side's run (a result line's, whole or the sum of its parts) as the result of each part that ran,
    each marked `restored` with `where` it was read from: what a part's call left in its folder, less its command."""
    by_job = {j["job"]: j for j in run["jobs"]}
    parts = run.get("parts") or [{**run, "jobs": job_numbers(run)}]
    out = []
    for p in parts:
        jobs = [by_job[n] for n in job_numbers(p)]
        samples = sum(j["samples"] for j in jobs)
        out.append(
            {
                "bench": "packs",
                "side": run["side"],
                "repeat": run["repeat"],
                "part": p.get("part", "1/1"),  # a whole side's run is part 1/1
                "wall_s": p["wall_s"],
                "startup_s": p.get("startup_s"),
                "samples": samples,
                "samples_per_s": round(samples / p["wall_s"], 3),
                "jobs": jobs,
                "device": run.get("device"),
                "caches": p.get("caches"),
                "machine": p.get("machine") or run.get("machine"),
                "restored": where,
            }
        )
    return out


def restore_side(
    path: Path, side: str, out: Path, same: Callable[[dict], bool], command: Callable[[str, Part, Path], list[str]]
) -> None:
    """bench.packs --restore SIDE: the side's part folders under --out (each its result.json, marked `restored`, its
    train.py arguments `command(side, part, folder)`) from the newest sweep-packs line of the results file `path`
    that holds it and that `same` takes for this workload, so that a side measured on an earlier machine, whose
    folders are gone with it, counts again beside sides run now. Refused where the side is under --out already."""
    found = recorded_side(path.read_text().splitlines() if path.is_file() else [], side, same)
    if found is None:
        raise SystemExit(f"--restore {side}: no sweep-packs line of {path} holds {side} of this workload")
    number, record = found
    where = f"{path.name} line {number} ({record['date']}, commit {record['commit']})"
    for run in (r for r in record["result"]["runs"] if r["side"] == side):
        if (out / Part().folder(side, run["repeat"])).exists() or found_parts(out, side, run["repeat"]):
            raise SystemExit(
                f"{out}: {side} repeat {run['repeat']} is there already; --restore writes only where it is not"
            )
        for result in restored_parts(run, where):
            part = parse_part(result["part"])
            folder = out / part.folder(side, run["repeat"])
            result["command"] = command(side, part, folder)
            folder.mkdir(parents=True)
            (folder / "result.json").write_text(json.dumps(result))
        print(f"{side} repeat {run['repeat']}: restored under {out} from {where}", flush=True)
