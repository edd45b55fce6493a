"""Table I, decisive version: the report's writing (decision.md, .csv, .json, the diagnostics'
tables, the copies into docs) for scripts/table1.py."""
import json
import os
import shutil
from pathlib import Path

import convergence as cv
from table1_plan import ALPHA, COMPARISONS, DELTA, EXTRA, GRAD_QUANTITIES, KINDS, PLAN

# ---------------------------------------------------------------------------------------------
# report: diagnostics tables

def load_json(path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as e:
        print(f"report: cannot read {path}: {e}")
        return None


def dict_of(x):
    return x if isinstance(x, dict) else {}


def num(x, spec=".3g"):
    return format(x, spec) if isinstance(x, (int, float)) and not isinstance(x, bool) else ""


def diag_paths(diags, kind):
    """The diagnostics' JSON files of one kind in the folders DIAGS (by name, the first folder
    that has it): the plan's order first, then any others."""
    found = {}
    for diag in reversed(diags):
        found.update({p.name: p for p in diag.glob(f"{kind}-*.json")} if diag.is_dir() else {})
    planned = [f"{kind}-{name}-{c}.json" for name, spec in PLAN.items()
               for c in spec["configs"] + ([EXTRA[1]] if name == EXTRA[0] else [])]
    return [found[n] for n in planned if n in found] + [found[n] for n in sorted(set(found) - set(planned))]


def pm(mean, sd, spec=".4f"):
    """"mean +- sd", or the mean alone when there is no sd (one value), "" without a mean."""
    return cv.fmt(mean, spec) + (f" +- {cv.fmt(sd, '.4f')}" if cv.finite(sd) else "")


def diag_md(diags, kind):
    """Markdown tables of the diagnostics' JSON files of KIND (one per checkpoint, a row per
    configuration); missing or unknown fields give empty cells."""
    if kind == "second-moment":  # a STATS object per projection kind and "all"
        title, cols = "## Second-moment share (s3r diag second-moment)", KINDS + ["all"]
        caption = "cells: median / q90 / q99 (aggregate) of the share"
        cell = lambda s: " / ".join(num(s.get(k)) for k in ("median", "q90", "q99")) + f" ({num(s.get('aggregate'))})"
        pick = lambda row: [dict_of(row.get("kinds")).get(k) for k in KINDS] + [row.get("all")]
    else:  # {mean, sd, error_of_key_mean} per quantity
        title = "## Gradient errors on the width study's bf16 checkpoint (s3r diag grad-error)"
        cols = [t for _, t in GRAD_QUANTITIES]
        caption = "cells: relative error, mean +- sd over keys (error of the key mean)"
        cell = lambda s: (f"{num(s.get('mean'), '.4f')} +- {num(s.get('sd'), '.4f')} "
                          f"({num(s.get('error_of_key_mean'), '.4f')})")
        pick = lambda row: [row.get(k) for k, _ in GRAD_QUANTITIES]
    md = []
    for path in diag_paths(diags, kind):
        j = load_json(path)
        if not isinstance(j, dict):
            continue
        trained = f", trained as {j['trained_as']}" if isinstance(j.get("trained_as"), str) else ""
        md += ["", f"{path.stem}: step {j.get('step', '?')}, {j.get('model', '?')}{trained}, "
               f"keys {j.get('keys', '?')}; {caption}", "", "| configuration | " + " | ".join(cols) + " |", "|---" * (len(cols) + 1) + "|"]
        for row in (j["rows"] if isinstance(j.get("rows"), list) else []):
            if isinstance(row, dict):
                cells = [cell(x) if isinstance(x, dict) else "" for x in pick(row)]
                md.append(f"| {row.get('configuration', '?')} | " + " | ".join(cells) + " |")
    return [title] + md + [""] if md else []


# ---------------------------------------------------------------------------------------------
# report: writing

def interval(ci):
    return f"[{ci[0]:+.4f}, {ci[1]:+.4f}]" if ci else ""


def comparison_md(rows, m):
    fewer = ("" if m == len(COMPARISONS) else f"; {len(COMPARISONS) - m} not tested yet (too few pairs) count as "
             "p = 1, so the adjusted p's can only fall when they are")
    md = [f"## Comparisons (Holm over the plan's family of {len(COMPARISONS)}{fewer})", "",
          "| id | a - b | n (plan) | mean +- sd | 95% CI | t | df | p | Holm p | power at 0.03 (obs. sd) | "
          "98.75% CI | verdict |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    f, notes = cv.fmt, []
    for r in rows:
        eq = r.get("ci_equivalence")
        eq = f"{interval(eq)} {'inside' if r['inside_margin'] else 'not inside'}" if eq else ""
        md.append(f"| {r['id']} | {r['a']} - {r['b']} | {r['n']} ({r['n_plan']}) | {pm(r['mean'], r['sd'], '+.4f')} | "
                  f"{interval(r.get('ci95'))} | {f(r.get('t'), '+.2f')} | {f(r.get('df'), 'd')} | "
                  f"{f(r.get('p'), '.3g')} | {f(r.get('p_holm'), '.3g')} | {f(r.get('power_observed_sd'), '.2f')} | "
                  f"{eq} | {r['verdict']} |")
        if r["n"] < r["n_plan"]:
            seeds = lambda k: ", ".join(map(str, r[k]))
            notes.append(f"{r['id']}: {r['n']} pair{'' if r['n'] == 1 else 's'}, the plan's n = {r['n_plan']} is not "
                         "reached" + (f"; seeds not (yet) run: {seeds('missing_seeds')}" if r["missing_seeds"] else "")
                         + (f"; diverged (NaN, excluded): seeds {seeds('diverged_seeds')}"
                            if r["diverged_seeds"] else ""))
    return md + ([""] + [f"Note: {n}." for n in notes] if notes else [])


def configs_md(configs):
    md = ["## Final validation loss per configuration (best lr, seeds)", "",
          "| study | configuration | best lr | sweep (seed 0) | n (plan) | mean +- sd | diverged |",
          "|---|---|---|---|---|---|---|"]
    for c in configs:
        lr = "sweep not finished" if c["best_lr"] is None else f"{c['best_lr']:g}" + (
            f" (at the {c['edge']} of the grid)" if c["edge"] else "")
        sweep = ", ".join(f"{k:g}: {cv.fmt_loss(v, '.4f')}" for k, v in sorted(c["sweep"].items()))
        md.append(f"| {c['study']}{' (record)' if c.get('source') == 'record' else ''} | {c['configuration']} | {lr} | {sweep} | {c['n']} ({c['n_plan']}) | "
                  f"{pm(c['mean'], c['sd'])} | {c['diverged'] or ''} |")
    return md


def decision_md(a, rows, m, claims, configs, diags, record):
    md = ["# Table I, decisive version: decision", "",
          f"Two-sided paired t-tests over seeds, Holm at family-wise {ALPHA}; effect of interest and "
          f"equivalence margin {DELTA} nats (plan: plan.md). Power and seeds needed: at the plan's level "
          f"{ALPHA}/{len(COMPARISONS)} (Bonferroni), with the observed sd. Diverged (NaN) runs are excluded from "
          "every statistic; missing runs are counted as missing."]
    for name in record:
        md += ["", f"The {name} study's runs are not under {a.out_root}: its per-seed differences, "
               f"configurations and diagnostics are those of the committed record ({Path(a.record).name} and "
               f"diag/ beside it, written by the report that had the runs); `scripts/table1.py run --part {name}` "
               "trains them again (bit for bit on the same kernel tier and GEMM backends) and `diag`, `report` "
               "then decide from the runs."]
    md += ["", "## Claims", ""]
    for c in claims:
        md.append(f"- ({c['claim']}) {c['statement']}: **{c['verdict']}**")
        md += [f"  - {i}: {t}" for i, t in c["reasons"].items()]
    md.append("- context of (d): " + "; ".join(f"{r['id']} {r['a']} - {r['b']}: {r['verdict']} ({r['reason']})"
                                              for r in rows if r["claim"] == "d-context"))
    md += [""] + comparison_md(rows, m) + [""] + configs_md(configs)
    return "\n".join(md + [""] + diag_md(diags, "second-moment") + diag_md(diags, "grad-error"))


def write_outputs(a, rows, m, claims, configs, record):
    root = Path(a.out_root)
    diags = [root / "diag"] + ([Path(a.record).parent / "diag"] if record else [])
    cv.write_atomic(root / "decision.md", decision_md(a, rows, m, claims, configs, diags, record))
    keys = ["id", "study", "a", "b", "claim", "kind", "n", "n_plan", "mean", "sd", "t", "df", "p", "p_holm",
            "power_observed_sd", "ci95", "ci_equivalence", "inside_margin", "verdict", "reason", "source"]
    table = [keys] + [[" ".join(f"{v:.6g}" for v in r[k]) if isinstance(r.get(k), list) else
                       (cv.fmt(r.get(k), ".6g") if isinstance(r.get(k), float) else r.get(k, ""))
                       for k in keys] for r in rows]
    cv.write_csv(root / "decision.csv", table)
    diags = {p.name: load_json(p) for kind in ("second-moment", "grad-error") for p in diag_paths(diags, kind)}
    cv.write_atomic(root / "decision.json", cv.dumps({
        "alpha": ALPHA, "delta": DELTA, "holm_family_size": len(COMPARISONS), "tested": m, "comparisons": rows, "claims": claims,
        "configurations": [dict(c, sweep={f"{k:g}": v for k, v in c["sweep"].items()}) for c in configs],
        "diag": diags}))


def copy_docs(a, studies, record):
    if not a.docs:
        return
    root, docs = Path(a.out_root), Path(a.docs)
    files = [(root / n, n) for n in ("decision.md", "decision.csv", "decision.json", "plan.md")]
    for name, st in studies.items():
        if name in record:  # its summaries in docs stay as the report with its runs wrote them
            continue
        files += [(st.out / n, f"{name}_{n}") for n in ("table1.md", "lr_sweep.csv", "val_curves.png")]
    if (root / "diag").is_dir():
        files += [(p, f"diag/{p.name}") for p in sorted((root / "diag").iterdir()) if p.suffix in (".json", ".txt")]
    for src, dst in files:
        if not src.is_file():
            print(f"report: not copied (absent): {src}")
            continue
        target = docs / dst
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, target.with_name(target.name + ".tmp"))
        os.replace(target.with_name(target.name + ".tmp"), target)
    print(f"report: copied the summaries to {docs}")
