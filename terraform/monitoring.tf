# Metrics, alerts, the SLO and the dashboard.
#
# Emission: every figure is a field of a structured log line the code
# already writes (one per drain invocation, one per drainer run and fault,
# one per workspace per verifier pass), turned into log-based metrics here.
# Nothing needs a Monitoring client or role, and the log lines and the
# metrics cannot disagree. The README's Observability section has the
# fields and what they cost.

locals {
  # The lines the metrics read: their message (a constant of the code:
  # functions.LogDrain, delivery.LogDrainRun, delivery.LogDrainFault,
  # delivery.LogVerifyWorkspace, functions.LogVerify) and the service that
  # writes them.
  log_lines = {
    drain            = "resource.type=\"cloud_run_revision\" AND resource.labels.service_name=\"replication-drain\" AND jsonPayload.message=\"replication drain\""
    drain_run        = "resource.type=\"cloud_run_revision\" AND resource.labels.service_name=\"replication-drain\" AND jsonPayload.message=\"replication drain run\""
    drain_fault      = "resource.type=\"cloud_run_revision\" AND resource.labels.service_name=\"replication-drain\" AND jsonPayload.message=\"replication: the drain met a fault; it claims again after a backoff\""
    verify_workspace = "resource.type=\"cloud_run_revision\" AND resource.labels.service_name=\"replication-verify\" AND jsonPayload.message=\"replication verify workspace\""
    verify_pass      = "resource.type=\"cloud_run_revision\" AND resource.labels.service_name=\"replication-verify\" AND jsonPayload.message=\"replication verify\""
    audit            = "resource.type=\"cloud_run_job\" AND resource.labels.job_name=\"replication-audit\" AND jsonPayload.message=\"replication audit\""
    connections      = "resource.type=\"cloud_run_revision\" AND jsonPayload.message=\"replication connections\""
  }

  # The bands the verifier reports lags in (delivery.LagBands; a test
  # checks they agree), and the index of the band under each bound in
  # minutes.
  lag_bands = ["under_1m", "under_5m", "under_15m", "under_30m", "under_1h", "over_1h"]
  # A failed workspace whose figures could not be read (delivery.BandUnknown):
  # in the SLO's total, never in its good samples.
  band_unknown = "unknown"
  band_index   = { "1" = 0, "5" = 1, "15" = 2, "30" = 3, "60" = 4 }
  bands_over   = { for m, i in local.band_index : m => slice(local.lag_bands, i + 1, length(local.lag_bands)) }
  bands_upto   = { for m, i in local.band_index : m => slice(local.lag_bands, 0, i + 1) }

  # Counters: one per matching line, by the labels given. The verifier's
  # per-workspace counter carries the lags as bands: it is what the lag
  # alerts and the SLO read (an INT64 point costs a tenth of a
  # distribution's).
  log_counters = {
    "replication/drain_invocations"   = { line = "drain", labels = ["workspace", "outcome", "cause"], description = "Drain invocations (wake-ups, each answered at once), by workspace (empty until the caller is authenticated for it), outcome (ok, unavailable, failed, unauthorized, …) and the cause of a 503 or 500; refused calls are sampled (replication/drain_refused counts them)." }
    "replication/drain_faults"        = { line = "drain_fault", labels = ["workspace", "cause"], description = "Faults a workspace's drainer met behind the answers (a claim, publish or acknowledgement failed), by cause: it backs off and claims again, answering wake-ups 503 meanwhile." }
    "replication/verifier_workspaces" = { line = "verify_workspace", labels = ["workspace", "outcome", "cause", "delivery_lag_band", "verification_lag_band", "set_aside_lag_band", "outstanding_band"], description = "Workspaces in verifier passes, by outcome (verified, partial, not_reached, inactive, failed), the cause of a failure, and lag bands (the outstanding band is the largest of the three; unknown when a failed workspace's figures could not be read)." }
    "replication/verifier_passes"     = { line = "verify_pass", labels = ["outcome"], description = "Verifier passes, by outcome (ok, partial_failure, …)." }
    "replication/audit_results"       = { line = "audit", labels = ["workspace", "outcome"], description = "Workspaces audited by the scheduled audit (the replication-audit job), by outcome (equal, differs, failed)." }
  }

  # Distributions: one value per matching line, from a numeric field; by
  # workspace (the lags and backlogs, unless var.workspace_gauges is false)
  # or for the fleet (the rates and latencies).
  log_distributions = {
    "replication/delivery_lag"          = { line = "verify_workspace", field = "oldest_pending_age_seconds", unit = "s", by_workspace = true, labels = [], description = "Age of the oldest pending event, set-aside ones apart (one value per workspace per pass)." }
    "replication/verification_lag"      = { line = "verify_workspace", field = "oldest_unverified_age_seconds", unit = "s", by_workspace = true, labels = [], description = "Time since the oldest accepted, unverified event was accepted." }
    "replication/pending_events"        = { line = "verify_workspace", field = "pending", unit = "1", by_workspace = true, labels = [], description = "Pending events (set-aside ones apart)." }
    "replication/unverified_events"     = { line = "verify_workspace", field = "unverified", unit = "1", by_workspace = true, labels = [], description = "Accepted events not verified yet." }
    "replication/set_aside_events"      = { line = "verify_workspace", field = "set_aside", unit = "1", by_workspace = true, labels = [], description = "Events set aside because they cannot be published." }
    "replication/set_aside_lag"         = { line = "verify_workspace", field = "oldest_set_aside_age_seconds", unit = "s", by_workspace = true, labels = [], description = "How long the longest set-aside event has been set aside, at least." }
    "replication/verified_events"       = { line = "verify_workspace", field = "verified", unit = "1", by_workspace = false, labels = [], description = "Events a workspace's pass verified (sum: events verified)." }
    "replication/requeued_events"       = { line = "verify_workspace", field = "requeued", unit = "1", by_workspace = false, labels = [], description = "Events a workspace's pass sent back to pending (absent 15 minutes after acceptance)." }
    "replication/verifier_lookup_time"  = { line = "verify_workspace", field = "lookup_seconds", unit = "s", by_workspace = false, labels = [], description = "Time a workspace's pass waited for BigQuery." }
    "replication/drain_published"       = { line = "drain_run", field = "count", unit = "1", by_workspace = false, labels = [], description = "Events a drainer published since its last line (a line when it ends and every minute it runs; sum: events published)." }
    "replication/drain_published_bytes" = { line = "drain_run", field = "bytes", unit = "By", by_workspace = false, labels = [], description = "Bytes a drainer published since its last line." }
    "replication/drain_duration"        = { line = "drain", field = "duration_ms", unit = "ms", by_workspace = false, labels = [], description = "Time to answer a wake-up: what every action of the ontology service waits for." }
    "replication/drain_publish_latency" = { line = "drain_run", field = "publish_ms", unit = "ms", by_workspace = false, labels = [], description = "Time a drainer spent in Pub/Sub's Publish since its last line." }
    "replication/drain_refused"         = { line = "drain", field = "refused", unit = "1", by_workspace = false, labels = [], description = "Refused calls (unauthorized, unknown workspace, bad path or method, token keys unavailable) a sampled WARNING line stands for: at most one line a second per outcome, cause and instance (sum: refused calls)." }
    "replication/verify_refused"        = { line = "verify_pass", field = "refused", unit = "1", by_workspace = false, labels = [], description = "Refused verifier calls (not the scheduler's token, bad method, Google's keys unavailable) a sampled WARNING line stands for: at most one line a second per outcome, cause and instance (sum: refused calls)." }
    "replication/connections_opened"    = { line = "connections", field = "opened", unit = "1", by_workspace = false, labels = ["server"], description = "Connections a process opened to a PostgreSQL server in a minute (a line a minute per server it opened any to): each is a session the server forks, logs in and warms; near 0 in steady state, about one a commit on a fleet without a pooler." }
  }

  metric_prefix = "logging.googleapis.com/user/"

  channels = concat(var.notification_channels, [for c in google_monitoring_notification_channel.email : c.id])
}

resource "google_logging_metric" "counter" {
  for_each    = local.log_counters
  project     = var.project
  name        = each.key
  description = each.value.description
  filter      = local.log_lines[each.value.line]
  metric_descriptor {
    metric_kind = "DELTA"
    value_type  = "INT64"
    unit        = "1"
    dynamic "labels" {
      for_each = toset(each.value.labels)
      content {
        key        = labels.value
        value_type = "STRING"
      }
    }
  }
  label_extractors = { for l in each.value.labels : l => "EXTRACT(jsonPayload.${l})" }
  depends_on       = [google_project_service.enabled]
}

resource "google_logging_metric" "distribution" {
  for_each        = local.log_distributions
  project         = var.project
  name            = each.key
  description     = each.value.description
  filter          = "${local.log_lines[each.value.line]} AND jsonPayload.${each.value.field}>=0"
  value_extractor = "EXTRACT(jsonPayload.${each.value.field})"
  metric_descriptor {
    metric_kind = "DELTA"
    value_type  = "DISTRIBUTION"
    unit        = each.value.unit
    dynamic "labels" {
      for_each = concat(each.value.by_workspace && var.workspace_gauges ? ["workspace"] : [], each.value.labels)
      content {
        key        = labels.value
        value_type = "STRING"
      }
    }
  }
  label_extractors = { for l in concat(each.value.by_workspace && var.workspace_gauges ? ["workspace"] : [], each.value.labels) : l => "EXTRACT(jsonPayload.${l})" }
  bucket_options {
    exponential_buckets {
      num_finite_buckets = 32
      growth_factor      = 2
      scale              = 0.01
    }
  }
  depends_on = [google_project_service.enabled]
}

# Cloud Monitoring knows a log-based metric some minutes after it is created
# (up to 10, its error says): an alert policy or SLO naming one created in
# the same apply fails with 404. What names a metric waits for this; a
# change of the metrics (their names) waits again.
resource "time_sleep" "metrics_known" {
  create_duration = var.metrics_propagation_wait
  triggers = {
    metrics = join(",", sort(concat(keys(google_logging_metric.counter), keys(google_logging_metric.distribution))))
  }
  depends_on = [google_logging_metric.counter, google_logging_metric.distribution]
}

resource "google_monitoring_notification_channel" "email" {
  for_each     = toset(var.alert_emails)
  project      = var.project
  display_name = "Ontology replication: ${each.key}"
  type         = "email"
  labels       = { email_address = each.key }
  depends_on   = [google_project_service.enabled]
}

# The dead-letter and subscription alerts read Pub/Sub's own metrics, and
# the connections alert Cloud SQL's, which live in the project of each
# subscription and instance: the workspaces' Pub/Sub and Cloud SQL projects
# other than the deployment project join its metrics scope, so that they
# alert too (the deployer needs monitoring.metricsScopes.link on both).
locals {
  monitored_projects = toset([
    for p in concat([for ws in local.workspaces : ws.pubsub_project], [for ws in local.workspaces : ws.sql_project]) : p if p != var.project
  ])
}

resource "google_monitoring_monitored_project" "pubsub" {
  for_each      = local.monitored_projects
  metrics_scope = "locations/global/metricsScopes/${var.project}"
  name          = each.key
  depends_on    = [google_project_service.enabled]
}

# The SLO: in var.slo_goal of workspace-minutes over 28 days, no event has
# waited more than var.slo_minutes to be verified. Each verifier pass gives
# one sample per workspace: its outstanding band (the larger of the delivery
# lag and the verification lag), good when within the bound. An event-based
# SLI ("each event verified within N minutes of its commit") needs each
# event's commit time, which the SDK's schema does not keep: this is its
# nearest measurable form.
resource "google_monitoring_custom_service" "replication" {
  project      = var.project
  service_id   = "ontology-replication"
  display_name = "Ontology replication"
  depends_on   = [google_project_service.enabled]
}

resource "google_monitoring_slo" "verified_in_time" {
  project             = var.project
  service             = google_monitoring_custom_service.replication.service_id
  slo_id              = "verified-within-${var.slo_minutes}m"
  display_name        = "Events verified within ${var.slo_minutes} minutes"
  goal                = var.slo_goal
  rolling_period_days = 28
  request_based_sli {
    good_total_ratio {
      good_service_filter  = "metric.type=\"${local.metric_prefix}replication/verifier_workspaces\" AND resource.type=\"cloud_run_revision\" AND metric.labels.outstanding_band=one_of(${join(", ", [for b in local.bands_upto[tostring(var.slo_minutes)] : "\"${b}\""])})"
      total_service_filter = "metric.type=\"${local.metric_prefix}replication/verifier_workspaces\" AND resource.type=\"cloud_run_revision\" AND metric.labels.outstanding_band=one_of(${join(", ", [for b in concat(local.lag_bands, [local.band_unknown]) : "\"${b}\""])})"
    }
  }
  depends_on = [time_sleep.metrics_known]
}

resource "google_monitoring_dashboard" "replication" {
  project = var.project
  dashboard_json = templatefile("${path.module}/dashboard.json.tftpl", {
    prefix           = local.metric_prefix
    workspace_gauges = var.workspace_gauges
  })
  depends_on = [time_sleep.metrics_known]
}
