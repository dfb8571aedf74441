# The decision: every gate under promotion-v1, the report (Markdown, and the
# HTML items and figures of `snakemake --report`), and a manifest of every
# artifact with its sha256.  Gates whose stages have not run are listed as
# not evaluated, which keeps the decision from ever being PROMOTE.  The
# completed decision is appended to results/ledger.jsonl (outside any audit:
# earlier decisions for the same candidate stay visible).  It cites the latest
# A/A calibration of its control on this host from results/calibrations.jsonl,
# which a calibration's decision appends its summary to.
#
# In a sweep this rule is `decision`, one per candidate (its decision.json,
# ledger line and report under candidates/<name>/promotion/), and `promotion`
# is the sweep's summary of them all (sweep/summary.json, .md, .html).


rule:
    name:
        "decision" if SWEEP else "promotion"
    input:
        unpack(decision_inputs),
    output:
        **({"calibration": CALIBRATION_SUMMARY} if CALIBRATION else {}),
        decision=DECISION,
        report=per_candidate(contracts.REPORT_MD),
        manifest=MANIFEST,
        summary=per_candidate(contracts.REPORT_SUMMARY),
        html=report(
            per_candidate(contracts.REPORT_HTML),
            caption="../report/decision.rst",
            category="1. Decision",
            labels={"figure": "decision and every reason"},
        ),
        plot=report(
            per_candidate(contracts.REPORT_PAIRED_PLOT),
            caption="../report/paired.rst",
            category="2. Quality",
            subcategory="Paired outcomes",
            labels={"figure": "paired outcomes per dataset"},
        ),
        divergence=report(
            per_candidate(contracts.REPORT_DIVERGENCE_PLOT),
            caption="../report/divergence.rst",
            category="3. Greedy divergence",
            labels={"figure": "divergence positions and margins"},
        ),
        boundary=report(
            per_candidate(contracts.REPORT_BOUNDARY),
            caption="../report/boundary.rst",
            category="4. Boundary",
            labels={"figure": "boundary cases side by side"},
        ),
        speed=report(
            per_candidate(contracts.REPORT_SPEED_PLOT),
            caption="../report/speed.rst",
            category="5. Speed",
            subcategory="Bracket",
            labels={"figure": "speed per repeat"},
        ),
        archive=report(
            per_candidate(contracts.REPORT_ARCHIVE_PLOT),
            caption="../report/control_archive.rst",
            category="5. Speed",
            subcategory="Control archive",
            labels={"figure": "control archive spread"},
        ),
    log:
        per_candidate_log("promotion.log"),
    conda:
        "../envs/analysis.yaml"
    params:
        **({"candidate": cand} if SWEEP else {}),
        audit=config["audit"],
        ledger=LEDGER,
        calibration=CALIBRATION,
        calibrations=CALIBRATIONS,
        # in a sweep, the config the candidate would have on its own (its change, the shared control):
        # what its ledger line hashes and its change record reads
        code=code("promotion"),
    script:
        "../scripts/promotion.py"


# The sweep's summary: every candidate's gates, speed gain, the quality loss
# ruled out and whether it may ship, one table (pairaudit/promotion/sweep.py).
if SWEEP:

    rule promotion:
        input:
            decisions=expand(DECISION, candidate=CANDIDATES),
        output:
            summary=SWEEP_SUMMARY,
            markdown=SWEEP_SUMMARY_MD,
            html=report(
                SWEEP_SUMMARY_HTML,
                caption="../report/sweep.rst",
                category="0. Sweep",
                labels={"figure": "every candidate's decision"},
            ),
        log:
            f"{LOGS}/sweep.log",
        conda:
            "../envs/analysis.yaml"
        params:
            audit=config["audit"],
            candidates=CANDIDATES,
            code=code("sweep"),
        script:
            "../scripts/sweep.py"
