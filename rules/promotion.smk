# The decision: every gate under promotion-v1, the report (Markdown, and the
# HTML items and figures of `snakemake --report`), and a manifest of every
# artifact with its sha256.  Gates whose stages have not run are listed as
# not evaluated, which keeps the decision from ever being PROMOTE.  The
# completed decision is appended to results/ledger.jsonl (outside any audit:
# earlier decisions for the same candidate stay visible).  It cites the latest
# A/A calibration of its control on this host from results/calibrations.jsonl,
# which a calibration's decision appends its summary to.


rule promotion:
    input:
        unpack(promotion_later_inputs),
        paired=expand(PAIRED, dataset=DATASETS),
        scores=expand(SCORES, dataset=DATASETS, arm=ARMS),
        launch=expand(LAUNCH, arm=ARMS),
        preflight=expand(PREFLIGHT, arm=ARMS),
        answers=expand(PHASE, arm=ARMS),
        divergence=list(divergence_paths().values()),
    output:
        **({"calibration": CALIBRATION_SUMMARY} if CALIBRATION else {}),
        decision=DECISION,
        report=artifact(contracts.REPORT_MD),
        manifest=MANIFEST,
        summary=artifact(contracts.REPORT_SUMMARY),
        html=report(
            artifact(contracts.REPORT_HTML),
            caption="../report/decision.rst",
            category="1. Decision",
            labels={"figure": "decision and every reason"},
        ),
        plot=report(
            artifact(contracts.REPORT_PAIRED_PLOT),
            caption="../report/paired.rst",
            category="2. Quality",
            subcategory="Paired outcomes",
            labels={"figure": "paired outcomes per dataset"},
        ),
        divergence=report(
            artifact(contracts.REPORT_DIVERGENCE_PLOT),
            caption="../report/divergence.rst",
            category="3. Greedy divergence",
            labels={"figure": "divergence positions and margins"},
        ),
        boundary=report(
            artifact(contracts.REPORT_BOUNDARY),
            caption="../report/boundary.rst",
            category="4. Boundary",
            labels={"figure": "boundary cases side by side"},
        ),
        speed=report(
            artifact(contracts.REPORT_SPEED_PLOT),
            caption="../report/speed.rst",
            category="5. Speed",
            subcategory="Bracket",
            labels={"figure": "speed per repeat"},
        ),
        archive=report(
            artifact(contracts.REPORT_ARCHIVE_PLOT),
            caption="../report/control_archive.rst",
            category="5. Speed",
            subcategory="Control archive",
            labels={"figure": "control archive spread"},
        ),
    log:
        f"{LOGS}/promotion.log",
    conda:
        "../envs/analysis.yaml"
    params:
        audit=config["audit"],
        ledger=LEDGER,
        calibration=CALIBRATION,
        calibrations=CALIBRATIONS,
        code=code("promotion"),
    script:
        "../scripts/promotion.py"
