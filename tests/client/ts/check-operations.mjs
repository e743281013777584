// Every operation of openapi/openapi.json must be a function of the generated SDK
// (hey-api names them after the operationId, in camel case, and capitalises a letter
// after a digit: conv2d is conv2D, hence the case-blind match).
import { readFileSync } from "node:fs";

const [specPath, sdkPath] = process.argv.slice(2);
const spec = JSON.parse(readFileSync(specPath, "utf8"));
const sdk = readFileSync(sdkPath, "utf8");
const camel = (id) => id.replace(/_([a-z0-9])/g, (_, c) => c.toUpperCase());
const ids = Object.values(spec.paths).flatMap((item) =>
  Object.values(item).filter((op) => op && op.operationId).map((op) => op.operationId),
);
const missing = ids.filter((id) => !new RegExp(`export const ${camel(id)}\\b`, "i").test(sdk));
if (missing.length > 0) {
  console.error(`operations missing from the TypeScript client: ${missing.join(", ")}`);
  process.exit(1);
}
console.log(`TypeScript client: all ${ids.length} operations generated`);
