"""The resident service (`ctx up`): warm engine, watchers, Prefect server and scheduled deployments."""
