// Greedy tokens of transformers.js on a folder, as a user's script gets them:
//   node generate.cjs MODULES FOLDER REQUEST
// MODULES holds node_modules/@huggingface/transformers; REQUEST is JSON {"runs": [[prompt, ...], ...],
// "new_tokens": N, "pad": ID}. The folder is loaded once with AutoModelForCausalLM.from_pretrained (local files
// only; the dtype, and so the file, is the one config.json's transformers.js_config names); each run is one
// generate() call on its prompts, left-padded with ID into one batch, greedy, N new tokens, no end-of-sequence stop.
// Prints one JSON line: per run, per prompt, the new tokens.
'use strict';

const [modules, folder, request] = process.argv.slice(2);
const { AutoModelForCausalLM, Tensor, env } = require(
  require.resolve('@huggingface/transformers', { paths: [modules] }));

async function main() {
  env.allowRemoteModels = false;
  env.localModelPath = '';
  const { runs, new_tokens: newTokens, pad } = JSON.parse(request);
  const model = await AutoModelForCausalLM.from_pretrained(folder, { local_files_only: true });
  const results = [];
  for (const prompts of runs) {
    const width = Math.max(...prompts.map((p) => p.length));
    const ids = [];
    const mask = [];
    for (const prompt of prompts) {
      const padding = width - prompt.length;
      for (let i = 0; i < width; ++i) {
        ids.push(BigInt(i < padding ? pad : prompt[i - padding]));
        mask.push(i < padding ? 0n : 1n);
      }
    }
    const shape = [prompts.length, width];
    const out = await model.generate({
      input_ids: new Tensor('int64', BigInt64Array.from(ids), shape),
      attention_mask: new Tensor('int64', BigInt64Array.from(mask), shape),
      max_new_tokens: newTokens,
      do_sample: false,
      eos_token_id: null,
    });
    results.push(out.tolist().map((row) => row.slice(width).map(Number)));
  }
  await model.dispose();
  process.stdout.write(JSON.stringify(results) + '\n');
}

main().catch((error) => {
  process.stderr.write(`${error && error.stack ? error.stack : error}\n`);
  process.exit(1);
});
