# Local monitoring: Prometheus against the local Ray (hack/monitor.sh), the chart's rules and dashboards.
PROMETHEUS_PORT ?= 9090
# Ray's temp dir, where `ray start --head` writes prom_metrics_service_discovery.json.
RAY_TEMP_DIR ?= /tmp/ray
export PROMETHEUS_PORT RAY_TEMP_DIR

.PHONY: monitor test-monitoring

monitor: venv ## Prometheus on 127.0.0.1:$(PROMETHEUS_PORT) scraping the local Ray, with the chart's rules; prints URLs
	@hack/monitor.sh

test-monitoring: venv tools ## Live monitoring test (real Prometheus, live Ray, training + Serve) and dashboard schema check
	$(PY) -m pytest -m monitoring tests/monitoring $(PYTEST_ARGS)
