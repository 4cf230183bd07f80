# Metrics, alerts, the SLO and the dashboard.
#
# Emission: every figure is a field of a structured log line the code
# already writes (one per drain invocation, one per workspace per verifier
# pass), turned into log-based metrics here. Nothing runs after a response
# (Cloud Run takes an instance's CPU away between requests, which starves
# an exporter's background flush), nothing needs a Monitoring client or
# role, and the log lines and the metrics cannot disagree. The README's
# Observability section has the fields and what they cost.

locals {
  # The lines the metrics read: their message (a constant of the code:
  # functions.LogDrain, delivery.LogVerifyWorkspace, functions.LogVerify) and
  # the service that writes them.
  log_lines = {
    drain            = "resource.type=\"cloud_run_revision\" AND resource.labels.service_name=\"replication-drain\" AND jsonPayload.message=\"replication drain\""
    verify_workspace = "resource.type=\"cloud_run_revision\" AND resource.labels.service_name=\"replication-verify\" AND jsonPayload.message=\"replication verify workspace\""
    verify_pass      = "resource.type=\"cloud_run_revision\" AND resource.labels.service_name=\"replication-verify\" AND jsonPayload.message=\"replication verify\""
    audit            = "resource.type=\"cloud_run_job\" AND resource.labels.job_name=\"replication-job\" AND jsonPayload.message=\"replication audit\""
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
    "replication/drain_invocations"   = { line = "drain", labels = ["workspace", "outcome", "cause"], description = "Drain invocations, by workspace (empty until the caller is authenticated for it), outcome (ok, unavailable, failed, unauthorized, …) and the cause of a 503 or 500; refused calls are sampled (replication/drain_refused counts them)." }
    "replication/verifier_workspaces" = { line = "verify_workspace", labels = ["workspace", "outcome", "cause", "delivery_lag_band", "verification_lag_band", "outstanding_band"], description = "Workspaces in verifier passes, by outcome (verified, partial, not_reached, inactive, failed), the cause of a failure, and lag bands (unknown when a failed workspace's figures could not be read)." }
    "replication/verifier_passes"     = { line = "verify_pass", labels = ["outcome"], description = "Verifier passes, by outcome (ok, partial_failure, …)." }
    "replication/audit_results"       = { line = "audit", labels = ["workspace", "outcome"], description = "Workspaces audited by `job audit`, by outcome (equal, differs, failed)." }
  }

  # Distributions: one value per matching line, from a numeric field; by
  # workspace (the lags and backlogs, unless var.workspace_gauges is false)
  # or for the fleet (the rates and latencies).
  log_distributions = {
    "replication/delivery_lag"          = { line = "verify_workspace", field = "oldest_pending_age_seconds", unit = "s", by_workspace = true, description = "Age of the oldest pending event, set-aside ones apart (one value per workspace per pass)." }
    "replication/verification_lag"      = { line = "verify_workspace", field = "oldest_unverified_age_seconds", unit = "s", by_workspace = true, description = "Time since the oldest accepted, unverified event was accepted." }
    "replication/pending_events"        = { line = "verify_workspace", field = "pending", unit = "1", by_workspace = true, description = "Pending events (set-aside ones apart)." }
    "replication/unverified_events"     = { line = "verify_workspace", field = "unverified", unit = "1", by_workspace = true, description = "Accepted events not verified yet." }
    "replication/set_aside_events"      = { line = "verify_workspace", field = "set_aside", unit = "1", by_workspace = true, description = "Events set aside because they cannot be published." }
    "replication/verified_events"       = { line = "verify_workspace", field = "verified", unit = "1", by_workspace = false, description = "Events a workspace's pass verified (sum: events verified)." }
    "replication/requeued_events"       = { line = "verify_workspace", field = "requeued", unit = "1", by_workspace = false, description = "Events a workspace's pass sent back to pending (absent 15 minutes after acceptance)." }
    "replication/verifier_lookup_time"  = { line = "verify_workspace", field = "lookup_seconds", unit = "s", by_workspace = false, description = "Time a workspace's pass waited for BigQuery." }
    "replication/drain_published"       = { line = "drain", field = "count", unit = "1", by_workspace = false, description = "Events a drain invocation published (sum: events published)." }
    "replication/drain_published_bytes" = { line = "drain", field = "bytes", unit = "By", by_workspace = false, description = "Bytes a drain invocation published." }
    "replication/drain_duration"        = { line = "drain", field = "duration_ms", unit = "ms", by_workspace = false, description = "Drain invocation duration." }
    "replication/drain_publish_latency" = { line = "drain", field = "publish_ms", unit = "ms", by_workspace = false, description = "Time a drain invocation spent in Pub/Sub's Publish." }
    "replication/drain_refused"         = { line = "drain", field = "refused", unit = "1", by_workspace = false, description = "Refused calls (unauthorized, unknown workspace, bad path or method) a sampled WARNING line stands for: at most one line a second per cause and instance (sum: refused calls)." }
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
      for_each = each.value.by_workspace && var.workspace_gauges ? ["workspace"] : []
      content {
        key        = labels.value
        value_type = "STRING"
      }
    }
  }
  label_extractors = each.value.by_workspace && var.workspace_gauges ? { workspace = "EXTRACT(jsonPayload.workspace)" } : {}
  bucket_options {
    exponential_buckets {
      num_finite_buckets = 32
      growth_factor      = 2
      scale              = 0.01
    }
  }
  depends_on = [google_project_service.enabled]
}

resource "google_monitoring_notification_channel" "email" {
  for_each     = toset(var.alert_emails)
  project      = var.project
  display_name = "Ontology replication: ${each.key}"
  type         = "email"
  labels       = { email_address = each.key }
  depends_on   = [google_project_service.enabled]
}

locals {
  # Alert policies on a lag band: a workspace's passes reporting its lag in
  # a band over the threshold, for five minutes.
  lag_alerts = {
    delivery_stall = {
      label   = "delivery_lag_band"
      minutes = tostring(var.delivery_lag_alert_minutes)
      name    = "Ontology replication: delivery stalled"
      doc     = "A workspace's oldest pending event has waited more than ${var.delivery_lag_alert_minutes} minutes to be published. Check the drain's invocations (replication/drain_invocations by outcome), Pub/Sub, and `job status`; `job drain --workspace <id>` publishes the backlog."
    }
    verification_lag = {
      label   = "verification_lag_band"
      minutes = tostring(var.verification_lag_alert_minutes)
      name    = "Ontology replication: verification lagging"
      doc     = "A workspace's oldest accepted event has not been found in BigQuery for more than ${var.verification_lag_alert_minutes} minutes. Check the BigQuery subscription and its dead letters (`job dead-letter`), and the verifier's passes (not_reached workspaces)."
    }
  }
}

resource "google_monitoring_alert_policy" "lag" {
  for_each              = local.lag_alerts
  project               = var.project
  display_name          = each.value.name
  combiner              = "OR"
  notification_channels = local.channels
  documentation {
    content   = each.value.doc
    mime_type = "text/markdown"
  }
  conditions {
    display_name = "${each.value.label} over ${each.value.minutes} minutes"
    condition_threshold {
      filter          = "metric.type=\"${local.metric_prefix}replication/verifier_workspaces\" AND resource.type=\"cloud_run_revision\" AND metric.labels.${each.value.label}=one_of(${join(", ", [for b in local.bands_over[each.value.minutes] : "\"${b}\""])})"
      comparison      = "COMPARISON_GT"
      threshold_value = 0
      duration        = "300s"
      aggregations {
        alignment_period     = "300s"
        per_series_aligner   = "ALIGN_DELTA"
        cross_series_reducer = "REDUCE_SUM"
        group_by_fields      = ["metric.label.workspace"]
      }
    }
  }
  depends_on = [google_logging_metric.counter]
}

# The dead-letter alert reads Pub/Sub's own metrics, which live in the
# project of each subscription: the workspaces' Pub/Sub projects other than
# the deployment project join its metrics scope, so that their dead letters
# alert too (the deployer needs monitoring.metricsScopes.link on both).
locals {
  monitored_projects = toset([for ws in local.workspaces : ws.pubsub_project if ws.pubsub_project != var.project])
}

resource "google_monitoring_monitored_project" "pubsub" {
  for_each      = local.monitored_projects
  metrics_scope = "locations/global/metricsScopes/${var.project}"
  name          = each.key
  depends_on    = [google_project_service.enabled]
}

resource "google_monitoring_alert_policy" "dead_letters" {
  project               = var.project
  display_name          = "Ontology replication: dead letters"
  combiner              = "OR"
  notification_channels = local.channels
  documentation {
    content   = "The BigQuery subscription dead-lettered messages: events BigQuery refused. `job dead-letter --workspace <id>` lists them by event; after fixing the cause, `--republish` sends them again."
    mime_type = "text/markdown"
  }
  conditions {
    display_name = "messages in a dead-letter subscription"
    condition_threshold {
      filter          = "metric.type=\"pubsub.googleapis.com/subscription/num_undelivered_messages\" AND resource.type=\"pubsub_subscription\" AND resource.labels.subscription_id=monitoring.regex.full_match(\".*-dead-letter\")"
      comparison      = "COMPARISON_GT"
      threshold_value = 0
      duration        = "60s"
      aggregations {
        alignment_period   = "60s"
        per_series_aligner = "ALIGN_MAX"
      }
    }
  }
  depends_on = [google_project_service.enabled]
}

resource "google_monitoring_alert_policy" "drain_failures" {
  project               = var.project
  display_name          = "Ontology replication: drain failing"
  combiner              = "OR"
  notification_channels = local.channels
  documentation {
    content   = "More than ${var.drain_failure_ratio_alert * 100}% of a workspace's drain invocations failed or were unavailable over 10 minutes. The drain's log lines (jsonPayload.message=\"replication drain\", severity ERROR) carry the cause; Error Reporting groups them."
    mime_type = "text/markdown"
  }
  conditions {
    display_name = "failed or unavailable drain invocations"
    condition_threshold {
      filter             = "metric.type=\"${local.metric_prefix}replication/drain_invocations\" AND resource.type=\"cloud_run_revision\" AND metric.labels.outcome=one_of(\"failed\", \"unavailable\", \"misconfigured\")"
      denominator_filter = "metric.type=\"${local.metric_prefix}replication/drain_invocations\" AND resource.type=\"cloud_run_revision\""
      comparison         = "COMPARISON_GT"
      threshold_value    = var.drain_failure_ratio_alert
      duration           = "600s"
      aggregations {
        alignment_period     = "600s"
        per_series_aligner   = "ALIGN_DELTA"
        cross_series_reducer = "REDUCE_SUM"
        group_by_fields      = ["metric.label.workspace"]
      }
      denominator_aggregations {
        alignment_period     = "600s"
        per_series_aligner   = "ALIGN_DELTA"
        cross_series_reducer = "REDUCE_SUM"
        group_by_fields      = ["metric.label.workspace"]
      }
    }
  }
  depends_on = [google_logging_metric.counter]
}

resource "google_monitoring_alert_policy" "audit" {
  project               = var.project
  display_name          = "Ontology replication: warehouse differs from source"
  combiner              = "OR"
  notification_channels = local.channels
  documentation {
    content   = "An audit (`job audit`, scheduled by audit_schedule) found a workspace whose warehouse differs from its source, or could not audit it. Its log line (jsonPayload.message=\"replication audit\") has the counts or the cause; `job audit --workspace W` lists the records, and `job repair --workspace W` re-delivers the missing, stale and deleted ones."
    mime_type = "text/markdown"
  }
  # One condition per outcome that needs a person, each by workspace.
  dynamic "conditions" {
    for_each = { differs = "warehouse differs from source", failed = "audit failed" }
    content {
      display_name = conditions.value
      condition_threshold {
        filter          = "metric.type=\"${local.metric_prefix}replication/audit_results\" AND resource.type=\"cloud_run_job\" AND metric.labels.outcome=\"${conditions.key}\""
        comparison      = "COMPARISON_GT"
        threshold_value = 0
        duration        = "0s"
        aggregations {
          alignment_period     = "300s"
          per_series_aligner   = "ALIGN_DELTA"
          cross_series_reducer = "REDUCE_SUM"
          group_by_fields      = ["metric.label.workspace"]
        }
      }
    }
  }
  depends_on = [google_logging_metric.counter]
}

# A workspace the verifier cannot serve (its BigQuery grant revoked, its
# database unreachable): failed on verifier_failure_passes of its passes
# within as many minutes (one pass a minute), whatever its lags.
resource "google_monitoring_alert_policy" "workspace_failing" {
  project               = var.project
  display_name          = "Ontology replication: workspace failing"
  combiner              = "OR"
  notification_channels = local.channels
  documentation {
    content   = "The verifier could not serve a workspace on ${var.verifier_failure_passes} passes in a row: its events are neither verified nor, if its database is unreachable, published. The metric's cause label (and the line's cause field, jsonPayload.message=\"replication verify workspace\") says which part failed: warehouse_denied (the BigQuery grant), warehouse_not_found, database_unavailable, database_denied, schema, …; the line's error says how. `job status --workspace <id>` and `job verify --workspace <id>` show it from the job."
    mime_type = "text/markdown"
  }
  conditions {
    display_name = "verifier passes failing for a workspace"
    condition_threshold {
      filter          = "metric.type=\"${local.metric_prefix}replication/verifier_workspaces\" AND resource.type=\"cloud_run_revision\" AND metric.labels.outcome=\"failed\""
      comparison      = "COMPARISON_GT"
      threshold_value = var.verifier_failure_passes - 1
      duration        = "0s"
      aggregations {
        alignment_period     = "${var.verifier_failure_passes * 60}s"
        per_series_aligner   = "ALIGN_DELTA"
        cross_series_reducer = "REDUCE_SUM"
        group_by_fields      = ["metric.label.workspace", "metric.label.cause"]
      }
    }
  }
  depends_on = [google_logging_metric.counter]
}

resource "google_monitoring_alert_policy" "verifier" {
  project               = var.project
  display_name          = "Ontology replication: verifier not keeping up"
  combiner              = "OR"
  notification_channels = local.channels
  documentation {
    content   = "Either no verifier pass logged for 10 minutes (the scheduler job, the verify service or its permissions), or passes keep not reaching workspaces for 15 minutes: raise verify_workers or verifier_shards."
    mime_type = "text/markdown"
  }
  # Only passes that ran count: a scheduler whose calls are refused (401 for
  # a wrong audience, 403, a misconfigured service) logs lines too.
  conditions {
    display_name = "no verifier pass"
    condition_absent {
      filter   = "metric.type=\"${local.metric_prefix}replication/verifier_passes\" AND resource.type=\"cloud_run_revision\" AND metric.labels.outcome=one_of(\"ok\", \"partial_failure\")"
      duration = "600s"
      aggregations {
        alignment_period     = "300s"
        per_series_aligner   = "ALIGN_DELTA"
        cross_series_reducer = "REDUCE_SUM"
      }
    }
  }
  conditions {
    display_name = "workspaces not reached"
    condition_threshold {
      filter          = "metric.type=\"${local.metric_prefix}replication/verifier_workspaces\" AND resource.type=\"cloud_run_revision\" AND metric.labels.outcome=\"not_reached\""
      comparison      = "COMPARISON_GT"
      threshold_value = 0
      duration        = "900s"
      aggregations {
        alignment_period     = "300s"
        per_series_aligner   = "ALIGN_DELTA"
        cross_series_reducer = "REDUCE_SUM"
      }
    }
  }
  depends_on = [google_logging_metric.counter]
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
  depends_on = [google_logging_metric.counter]
}

# Burn-rate alerts (the SRE workbook's pair): the error budget burning 14.4×
# too fast over an hour (2% of 28 days' budget gone), or 6× over six hours.
resource "google_monitoring_alert_policy" "slo_burn" {
  project               = var.project
  display_name          = "Ontology replication: SLO burning"
  combiner              = "OR"
  notification_channels = local.channels
  documentation {
    content   = "The error budget of \"${google_monitoring_slo.verified_in_time.display_name}\" is burning fast: workspaces have events waiting longer than ${var.slo_minutes} minutes. See the lag alerts and the dashboard."
    mime_type = "text/markdown"
  }
  conditions {
    display_name = "fast burn (1 h, 14.4×)"
    condition_threshold {
      filter          = "select_slo_burn_rate(\"${google_monitoring_slo.verified_in_time.name}\", \"3600s\")"
      comparison      = "COMPARISON_GT"
      threshold_value = 14.4
      duration        = "0s"
    }
  }
  conditions {
    display_name = "slow burn (6 h, 6×)"
    condition_threshold {
      filter          = "select_slo_burn_rate(\"${google_monitoring_slo.verified_in_time.name}\", \"21600s\")"
      comparison      = "COMPARISON_GT"
      threshold_value = 6
      duration        = "0s"
    }
  }
}

resource "google_monitoring_dashboard" "replication" {
  project = var.project
  dashboard_json = templatefile("${path.module}/dashboard.json.tftpl", {
    prefix           = local.metric_prefix
    workspace_gauges = var.workspace_gauges
  })
  depends_on = [google_logging_metric.counter, google_logging_metric.distribution]
}
