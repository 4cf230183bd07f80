# Alert policies.
#
# Each has a severity: CRITICAL pages (var.notification_channels and
# var.alert_emails), WARNING opens a ticket (var.ticket_notification_channels,
# or the paging channels when none is given). Pages: delivery stalled,
# verification lagging, events set aside, the BigQuery subscription stuck,
# a workspace failing, no verifier pass, connections near an instance's
# max_connections, the SLO's fast and slow burns. Tickets: the drain failing,
# dead letters, workspaces not reached, the scheduled audit's findings and
# failures, a failed execution of replication-job, the SLO's 3-day burn. Each policy's documentation names the workspace (Cloud
# Monitoring's ${metric.label.workspace}, written $${…} in HCL) or the
# resource that fired, and the command to run first, as a Cloud Run job
# execution (terraform/README.md, Runbook, says how to read its output).

locals {
  ticket_channels = length(var.ticket_notification_channels) > 0 ? var.ticket_notification_channels : local.channels
  severity_channels = {
    CRITICAL = local.channels
    WARNING  = local.ticket_channels
  }
  # The scheduler jobs that call the verifier, as the runbook checks them.
  verify_scheduler_jobs = join(", ", [for name in(var.verifier_shards == 1 ? ["replication-verify"] : [for i in range(var.verifier_shards) : "replication-verify-${i}"]) :
    "`gcloud scheduler jobs describe ${name} --project=${var.project} --location=${var.region}`"
  ])
  # The job's commands as the runbook runs them in production.
  job_command = "gcloud run jobs execute replication-job --project=${var.project} --region=${var.region} --async --args="
  # Pasted alone, such a command prints only that the execution started:
  # each documentation that gives one says where its output is.
  job_output = " Each `gcloud run jobs execute` above starts an execution and prints its name; its output is in that execution's logs: terraform/README.md, Runbook, gives the commands (`gcloud logging read … --format='value(textPayload)'`)."
  workspace  = "$${metric.label.workspace}"

  # Alert policies on a lag band: a workspace's passes reporting its lag in
  # a band over the threshold, for five minutes.
  lag_alerts = {
    delivery_stall = {
      label   = "delivery_lag_band"
      minutes = tostring(var.delivery_lag_alert_minutes)
      name    = "Ontology replication: delivery stalled"
      doc     = "The oldest pending event of workspace ${local.workspace} has waited more than ${var.delivery_lag_alert_minutes} minutes to be published. Check the drain's invocations (replication/drain_invocations by outcome and cause) and Pub/Sub; then `${local.job_command}status,--workspace=${local.workspace}`, and `${local.job_command}drain,--workspace=${local.workspace}` publishes the backlog.${local.job_output}"
    }
    verification_lag = {
      label   = "verification_lag_band"
      minutes = tostring(var.verification_lag_alert_minutes)
      name    = "Ontology replication: verification lagging"
      doc     = "The oldest accepted event of workspace ${local.workspace} has not been found in BigQuery for more than ${var.verification_lag_alert_minutes} minutes. Check its BigQuery subscription (the subscription alert) and its dead letters: `${local.job_command}dead-letter,--workspace=${local.workspace}`; and whether the verifier reaches it (the not-reached alert).${local.job_output}"
    }
    set_aside = {
      label   = "set_aside_lag_band"
      minutes = tostring(var.set_aside_alert_minutes)
      name    = "Ontology replication: events set aside"
      doc     = "Workspace ${local.workspace} has events set aside for more than ${var.set_aside_alert_minutes} minutes: events the drain cannot publish (their history row gone, their capture malformed, too large for Pub/Sub, refused by it). They will not arrive on their own. `${local.job_command}set-aside,--workspace=${local.workspace}` lists them with their reasons; once the cause is fixed, `${local.job_command}set-aside,--workspace=${local.workspace},--retry` sends them again.${local.job_output}"
    }
  }
}

resource "google_monitoring_alert_policy" "lag" {
  for_each              = local.lag_alerts
  project               = var.project
  display_name          = each.value.name
  combiner              = "OR"
  severity              = "CRITICAL"
  notification_channels = local.severity_channels["CRITICAL"]
  user_labels           = var.labels
  documentation {
    subject   = "${each.value.name}: $${metric.label.workspace}"
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
  depends_on = [time_sleep.metrics_known]
}

resource "google_monitoring_alert_policy" "dead_letters" {
  project               = var.project
  display_name          = "Ontology replication: dead letters"
  combiner              = "OR"
  severity              = "WARNING"
  notification_channels = local.severity_channels["WARNING"]
  user_labels           = var.labels
  documentation {
    subject   = "Ontology replication: dead letters in $${resource.label.subscription_id}"
    content   = "The BigQuery subscription dead-lettered messages into $${resource.label.subscription_id}: events BigQuery refused. `${local.job_command}dead-letter,--workspace=<the workspace of that topic>` lists them by event; after fixing the cause, `--republish` sends them again.${local.job_output}"
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

# A BigQuery subscription that stopped writing (its grant revoked, the
# table's schema changed, BigQuery failing) pages when its oldest message
# is older than var.subscription_backlog_alert_minutes, long before the
# verification band would; its write errors open a ticket as they start.
resource "google_monitoring_alert_policy" "bigquery_subscription" {
  project               = var.project
  display_name          = "Ontology replication: BigQuery subscription stuck"
  combiner              = "OR"
  severity              = "CRITICAL"
  notification_channels = local.severity_channels["CRITICAL"]
  user_labels           = var.labels
  documentation {
    subject   = "Ontology replication: BigQuery subscription $${resource.label.subscription_id} stuck"
    content   = "The BigQuery subscription $${resource.label.subscription_id} has a message older than ${var.subscription_backlog_alert_minutes} minutes: it is not writing to its events table. The subscription's page in the console shows its state (PERMISSION_DENIED, NOT_FOUND, SCHEMA_MISMATCH); `gcloud pubsub subscriptions describe $${resource.label.subscription_id} --project=$${resource.label.project_id}` says the same. Its events are safe in the subscription for 7 days; once it writes again, the verifier catches up."
    mime_type = "text/markdown"
  }
  conditions {
    display_name = "oldest unacked message over ${var.subscription_backlog_alert_minutes} minutes"
    condition_threshold {
      filter          = "metric.type=\"pubsub.googleapis.com/subscription/oldest_unacked_message_age\" AND resource.type=\"pubsub_subscription\" AND resource.labels.subscription_id=monitoring.regex.full_match(\".*-bigquery\")"
      comparison      = "COMPARISON_GT"
      threshold_value = var.subscription_backlog_alert_minutes * 60
      duration        = "300s"
      aggregations {
        alignment_period   = "60s"
        per_series_aligner = "ALIGN_MAX"
      }
    }
  }
  depends_on = [google_project_service.enabled]
}

resource "google_monitoring_alert_policy" "bigquery_write_errors" {
  project               = var.project
  display_name          = "Ontology replication: BigQuery subscription write errors"
  combiner              = "OR"
  severity              = "WARNING"
  notification_channels = local.severity_channels["WARNING"]
  user_labels           = var.labels
  documentation {
    subject   = "Ontology replication: write errors in $${resource.label.subscription_id}"
    content   = "The BigQuery subscription $${resource.label.subscription_id} has had writes refused for 10 minutes (response class $${metric.label.response_class}). Refused messages are retried and then dead-lettered; `gcloud pubsub subscriptions describe $${resource.label.subscription_id} --project=$${resource.label.project_id}` shows its state."
    mime_type = "text/markdown"
  }
  conditions {
    display_name = "writes refused"
    condition_threshold {
      filter          = "metric.type=\"pubsub.googleapis.com/subscription/push_request_count\" AND resource.type=\"pubsub_subscription\" AND resource.labels.subscription_id=monitoring.regex.full_match(\".*-bigquery\") AND metric.labels.response_class!=\"ack\""
      comparison      = "COMPARISON_GT"
      threshold_value = 0
      duration        = "600s"
      aggregations {
        alignment_period     = "300s"
        per_series_aligner   = "ALIGN_DELTA"
        cross_series_reducer = "REDUCE_SUM"
        group_by_fields      = ["resource.label.subscription_id", "resource.label.project_id", "metric.label.response_class"]
      }
    }
  }
  depends_on = [google_project_service.enabled]
}

# The drain failing: more than var.drain_failure_ratio_alert of a
# workspace's invocations failed (500) or were unavailable (503) over 10
# minutes, and at least var.drain_failure_min_count of them, on the same
# workspace (PromQL; a ratio condition alone pages on one 503 in two
# wake-ups). The 503s are logged at WARNING, the 500s at ERROR. A ticket,
# not a page: it is a cause (a minute's Pub/Sub blip at 10 wake-ups a second
# fires it while delivery never lags, as the drains queue again and the next
# wake-ups publish); the symptom, delivery stalled, pages.
locals {
  drain_invocations = "logging_googleapis_com:user_replication_drain_invocations{monitored_resource=\"cloud_run_revision\"}"
  drain_failed      = "logging_googleapis_com:user_replication_drain_invocations{monitored_resource=\"cloud_run_revision\", outcome=~\"failed|unavailable|misconfigured\"}"
  drain_failing     = <<-EOT
    (sum by (workspace) (increase(${local.drain_failed}[10m]))
      / sum by (workspace) (increase(${local.drain_invocations}[10m])) > ${var.drain_failure_ratio_alert})
    and on (workspace)
    (sum by (workspace) (increase(${local.drain_failed}[10m])) >= ${var.drain_failure_min_count})
  EOT
}

resource "google_monitoring_alert_policy" "drain_failures" {
  project               = var.project
  display_name          = "Ontology replication: drain failing"
  combiner              = "OR"
  severity              = "WARNING"
  notification_channels = local.severity_channels["WARNING"]
  user_labels           = var.labels
  documentation {
    subject   = "Ontology replication: drain failing for ${local.workspace}"
    content   = "More than ${var.drain_failure_ratio_alert * 100}% of workspace ${local.workspace}'s drain invocations, and at least ${var.drain_failure_min_count}, failed (500, logged at ERROR) or were unavailable (503, logged at WARNING) over 10 minutes. The lines (jsonPayload.message=\"replication drain\", jsonPayload.workspace=\"${local.workspace}\") carry the cause: pubsub_unavailable, database_unavailable, database_busy, …; Error Reporting groups the 500s. `${local.job_command}status,--workspace=${local.workspace}` shows the backlog.${local.job_output}"
    mime_type = "text/markdown"
  }
  conditions {
    display_name = "failed or unavailable drain invocations"
    condition_prometheus_query_language {
      query    = local.drain_failing
      duration = "0s"
    }
  }
  depends_on = [time_sleep.metrics_known]
}

resource "google_monitoring_alert_policy" "audit" {
  project               = var.project
  display_name          = "Ontology replication: warehouse differs from source"
  combiner              = "OR"
  severity              = "WARNING"
  notification_channels = local.severity_channels["WARNING"]
  user_labels           = var.labels
  documentation {
    subject   = "Ontology replication: warehouse differs from source in ${local.workspace}"
    content   = "The scheduled audit (audit_schedule) found that workspace ${local.workspace}'s warehouse differs from its source, or could not audit it. Its log line (jsonPayload.message=\"replication audit\") has the counts or the cause; `${local.job_command}audit,--workspace=${local.workspace}` lists the records, and `${local.job_command}repair,--workspace=${local.workspace}` re-delivers the missing, stale and deleted ones. Audits run by hand are not counted.${local.job_output}"
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
  depends_on = [time_sleep.metrics_known]
}

# The scheduled audit itself: an execution that failed (a bad registry, out
# of memory: it died before its result lines), or no result line within
# var.audit_result_max_hours.
resource "google_monitoring_alert_policy" "audit_job" {
  count                 = var.audit_schedule != "" ? 1 : 0
  project               = var.project
  display_name          = "Ontology replication: scheduled audit not done"
  combiner              = "OR"
  severity              = "WARNING"
  notification_channels = local.severity_channels["WARNING"]
  user_labels           = var.labels
  documentation {
    subject   = "Ontology replication: the scheduled audit did not run to its end"
    content   = "An execution of the replication-audit job failed, or none wrote a result line (jsonPayload.message=\"replication audit\") for ${var.audit_result_max_hours} hours. `gcloud run jobs executions list --job=replication-audit --project=${var.project} --region=${var.region}` lists the executions; the failed one's logs say why (terraform/README.md, Runbook)."
    mime_type = "text/markdown"
  }
  conditions {
    display_name = "audit execution failed"
    condition_threshold {
      filter          = "metric.type=\"run.googleapis.com/job/completed_execution_count\" AND resource.type=\"cloud_run_job\" AND resource.labels.job_name=\"replication-audit\" AND metric.labels.result=\"failed\""
      comparison      = "COMPARISON_GT"
      threshold_value = 0
      duration        = "0s"
      aggregations {
        alignment_period     = "300s"
        per_series_aligner   = "ALIGN_DELTA"
        cross_series_reducer = "REDUCE_SUM"
      }
    }
  }
  conditions {
    display_name = "no audit result for ${var.audit_result_max_hours} hours"
    condition_absent {
      filter   = "metric.type=\"${local.metric_prefix}replication/audit_results\" AND resource.type=\"cloud_run_job\""
      duration = "${var.audit_result_max_hours * 3600}s"
      aggregations {
        alignment_period     = "3600s"
        per_series_aligner   = "ALIGN_DELTA"
        cross_series_reducer = "REDUCE_SUM"
      }
    }
  }
  depends_on = [time_sleep.metrics_known]
}

# A workspace the verifier cannot serve (its BigQuery grant revoked, its
# database unreachable): failed on verifier_failure_passes of its passes
# within as many minutes (one pass a minute), whatever its lags.
resource "google_monitoring_alert_policy" "workspace_failing" {
  project               = var.project
  display_name          = "Ontology replication: workspace failing"
  combiner              = "OR"
  severity              = "CRITICAL"
  notification_channels = local.severity_channels["CRITICAL"]
  user_labels           = var.labels
  documentation {
    subject   = "Ontology replication: workspace ${local.workspace} failing ($${metric.label.cause})"
    content   = "The verifier could not serve workspace ${local.workspace} on ${var.verifier_failure_passes} passes in a row (cause $${metric.label.cause}): its events are neither verified nor, if its database is unreachable, published. The cause says which part failed: warehouse_denied (the BigQuery grant), warehouse_not_found, database_unavailable, database_denied, schema, …; the line's error (jsonPayload.message=\"replication verify workspace\") says how. `${local.job_command}status,--workspace=${local.workspace}` and `${local.job_command}verify,--workspace=${local.workspace}` show it from the job.${local.job_output}"
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
  depends_on = [time_sleep.metrics_known]
}

# Only passes that ran count: a scheduler whose calls are refused (401 for
# a wrong audience, 403, a misconfigured service) logs lines too.
resource "google_monitoring_alert_policy" "verifier" {
  project               = var.project
  display_name          = "Ontology replication: no verifier pass"
  combiner              = "OR"
  severity              = "CRITICAL"
  notification_channels = local.severity_channels["CRITICAL"]
  user_labels           = var.labels
  documentation {
    subject   = "Ontology replication: no verifier pass for 10 minutes"
    content   = "No verifier pass logged for 10 minutes: nothing is verified, and nothing the wake-ups missed is swept. Check the scheduler's calls with gcloud scheduler jobs describe (${local.verify_scheduler_jobs}: the last attempt's status), the replication-verify service's logs (jsonPayload.message=\"replication verify\", a 401 or 403 is the caller check) and its permissions."
    mime_type = "text/markdown"
  }
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
  depends_on = [time_sleep.metrics_known]
}

resource "google_monitoring_alert_policy" "verifier_not_reaching" {
  project               = var.project
  display_name          = "Ontology replication: verifier not reaching workspaces"
  combiner              = "OR"
  severity              = "WARNING"
  notification_channels = local.severity_channels["WARNING"]
  user_labels           = var.labels
  documentation {
    subject   = "Ontology replication: verifier not reaching workspaces"
    content   = "Verifier passes have not reached every workspace for 15 minutes (their lines say outcome not_reached): the registry has outgrown one pass's budget. Raise verify_workers or verifier_shards."
    mime_type = "text/markdown"
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
  depends_on = [time_sleep.metrics_known]
}

# Connections: each Cloud SQL instance's backends against its
# max_connections (sql_instance_max_connections), every database of the
# instance summed: the SDK's own writes fail once it is reached.
resource "google_monitoring_alert_policy" "connections" {
  for_each              = local.sql_instance
  project               = var.project
  display_name          = "Ontology replication: connections near max_connections on ${each.value.name}"
  combiner              = "OR"
  severity              = "CRITICAL"
  notification_channels = local.severity_channels["CRITICAL"]
  user_labels           = var.labels
  documentation {
    subject   = "Ontology replication: ${each.value.name} near max_connections"
    content   = "Cloud SQL instance ${each.key} has more than ${floor(var.connections_alert_ratio * lookup(var.sql_instance_max_connections, each.key, var.default_sql_max_connections))} backends, ${var.connections_alert_ratio * 100}% of its max_connections: at 100% the ontology service's own writes are refused. `SELECT usename, application_name, count(*) FROM pg_stat_activity GROUP BY 1, 2` on it shows who holds them (this deployment's are application_name ontology-replication); terraform/README.md, Connection budget, says what this deployment may hold."
    mime_type = "text/markdown"
  }
  conditions {
    display_name = "backends over ${var.connections_alert_ratio * 100}% of max_connections"
    condition_threshold {
      filter          = "metric.type=\"cloudsql.googleapis.com/database/postgresql/num_backends\" AND resource.type=\"cloudsql_database\" AND resource.labels.database_id=\"${each.value.project}:${each.value.name}\""
      comparison      = "COMPARISON_GT"
      threshold_value = floor(var.connections_alert_ratio * lookup(var.sql_instance_max_connections, each.key, var.default_sql_max_connections))
      duration        = "300s"
      aggregations {
        alignment_period     = "60s"
        per_series_aligner   = "ALIGN_MAX"
        cross_series_reducer = "REDUCE_SUM"
        group_by_fields      = ["resource.label.database_id"]
      }
    }
  }
  depends_on = [google_project_service.enabled]
}

# Burn-rate alerts, as the SRE workbook's multiwindow, multi-burn-rate
# alerts: the error budget burning 14.4× too fast over an hour (2% of 28
# days' budget gone) pages, and so does 6× over six hours (5%); 1× over
# three days (10%) opens a ticket. Each fires only while its short window
# (a twelfth of the long one) burns as fast too, so that it stops once
# the burn has: without it an alert stays open up to its long window after
# recovery.
locals {
  slo_burns = {
    fast   = { long = 3600, short = 300, rate = 14.4, severity = "CRITICAL", name = "fast burn (1 h and 5 min, 14.4×)" }
    slow   = { long = 21600, short = 1800, rate = 6, severity = "CRITICAL", name = "slow burn (6 h and 30 min, 6×)" }
    budget = { long = 259200, short = 21600, rate = 1, severity = "WARNING", name = "budget burn (3 d and 6 h, 1×)" }
  }
}

resource "google_monitoring_alert_policy" "slo_burn" {
  for_each              = local.slo_burns
  project               = var.project
  display_name          = "Ontology replication: SLO ${each.value.name}"
  combiner              = "AND"
  severity              = each.value.severity
  notification_channels = local.severity_channels[each.value.severity]
  user_labels           = var.labels
  documentation {
    subject   = "Ontology replication: SLO ${each.value.name}"
    content   = "The error budget of \"${google_monitoring_slo.verified_in_time.display_name}\" is burning ${each.value.rate}× too fast over ${each.value.long}s and still over the last ${each.value.short}s: workspaces have events waiting longer than ${var.slo_minutes} minutes (pending, unverified or set aside). The lag alerts name them; the dashboard's lag charts show which; `${local.job_command}status` lists every workspace.${local.job_output}"
    mime_type = "text/markdown"
  }
  dynamic "conditions" {
    for_each = { long = each.value.long, short = each.value.short }
    content {
      display_name = "burn rate over ${conditions.value}s above ${each.value.rate}"
      condition_threshold {
        filter          = "select_slo_burn_rate(\"${google_monitoring_slo.verified_in_time.name}\", \"${conditions.value}s\")"
        comparison      = "COMPARISON_GT"
        threshold_value = each.value.rate
        duration        = "0s"
      }
    }
  }
}

moved {
  from = google_monitoring_alert_policy.slo_burn
  to   = google_monitoring_alert_policy.slo_burn["fast"]
}

# An operator's execution of replication-job that failed (a command that
# met what it could not ride out, or an audit that found differences:
# exit 1) opens a ticket: run by hand at 2 am, it would otherwise alert
# nobody. The scheduled audit has its own alerts.
resource "google_monitoring_alert_policy" "job_failed" {
  count                 = local.deploy ? 1 : 0
  project               = var.project
  display_name          = "Ontology replication: job execution failed"
  combiner              = "OR"
  severity              = "WARNING"
  notification_channels = local.severity_channels["WARNING"]
  user_labels           = var.labels
  documentation {
    subject   = "Ontology replication: an execution of replication-job failed"
    content   = "An execution of the replication-job job failed: its command failed, or found something (audit with differences, exit 1). `gcloud run jobs executions list --job=replication-job --project=${var.project} --region=${var.region}` lists the executions; the failed one's output and log lines say why (terraform/README.md, Runbook: reading an execution)."
    mime_type = "text/markdown"
  }
  conditions {
    display_name = "replication-job execution failed"
    condition_threshold {
      filter          = "metric.type=\"run.googleapis.com/job/completed_execution_count\" AND resource.type=\"cloud_run_job\" AND resource.labels.job_name=\"replication-job\" AND metric.labels.result=\"failed\""
      comparison      = "COMPARISON_GT"
      threshold_value = 0
      duration        = "0s"
      aggregations {
        alignment_period     = "300s"
        per_series_aligner   = "ALIGN_DELTA"
        cross_series_reducer = "REDUCE_SUM"
      }
    }
  }
  depends_on = [google_project_service.enabled]
}
