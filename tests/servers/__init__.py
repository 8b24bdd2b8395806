"""What the docker-tier smoke tests serve and run (the servers and stand-ins are stdlib only).

- openai_server.py: a small OpenAI-compatible server with failure modes (SMOKE_TEST_MODE).
- gsm8k_local.py: a generated GSM8K-format data set and an lm_eval task including the real
  gsm8k config over it; the real lm_eval runs it (image.py installs the pinned lm-eval; the image
  the pipeline builds in tests/docker/test_e2e.py bakes it in from the wheelhouse).
- standin_benchmark_serving.py: answers for `atom.benchmarks.benchmark_serving` (which needs
  ATOM and a tokenizer), in that script's code shape; writes its --save-result JSON.
- image.py: the test server image (base image + the real lm_eval + these files).
- sshd.py: a real sshd on 127.0.0.1 in front of the local dockerd (ssh:// engines).
- recipe-test.yaml: the test recipe (same schema as recipes/*.yaml) pointing at these.
"""
