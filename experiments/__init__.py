"""The reproduction harness: workloads, variants, measurement, records and figures."""
