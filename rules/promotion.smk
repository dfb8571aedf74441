# The decision: every gate under promotion-v1, the report, and a manifest of
# every artifact with its sha256.  Gates whose stages are not built yet are
# listed as not evaluated, which keeps the decision from ever being PROMOTE.


rule promotion:
    input:
        paired=expand(f"{R}/paired/{{dataset}}.json", dataset=DATASETS),
        launch=expand(f"{R}/launch/{{arm}}.json", arm=ARMS),
        preflight=expand(f"{R}/preflight/{{arm}}.json", arm=ARMS),
        divergence=expand(f"{R}/divergence/{{dataset}}.json", dataset=DATASETS),
    output:
        decision=f"{R}/promotion/decision.json",
        report=report(f"{R}/promotion/report.md", category="Decision"),
        manifest=f"{R}/promotion/manifest.json",
        plot=report(f"{R}/promotion/paired.png", category="Paired outcomes"),
    log:
        f"{R}/logs/promotion.log",
    conda:
        "../envs/analysis.yaml"
    params:
        code=CODE["promotion"],
    script:
        "../scripts/promotion.py"
