"""Stand-ins for the docker-tier smoke tests (stdlib only: the test images have python3 and nothing else).

- openai_server.py: a small OpenAI-compatible server with failure modes (SMOKE_TEST_MODE).
- standin_lm_eval.py: answers for `lm_eval` (no datasets here); writes lm_eval's results file format.
- standin_benchmark_serving.py: answers for `atom.benchmarks.benchmark_serving`;
  writes its --save-result JSON.
- recipe-test.yaml: the test recipe (same schema as recipes/*.yaml) pointing at these.
"""
