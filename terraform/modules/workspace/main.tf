data "google_project" "pubsub" {
  project_id = var.pubsub_project
}

locals {
  # Pub/Sub's service agent writes to BigQuery and moves dead letters.
  pubsub_agent = "serviceAccount:service-${data.google_project.pubsub.number}@gcp-sa-pubsub.iam.gserviceaccount.com"
}

# On a brand-new project the Pub/Sub service agent may not exist until
# something uses Pub/Sub, and a grant naming it fails with "service account
# does not exist": it is made here first (generateServiceIdentity, which
# returns the existing agent when there is one; its destroy does nothing,
# the agent stays). Every grant to local.pubsub_agent depends on it. Only
# the google-beta provider has the resource.
resource "google_project_service_identity" "pubsub" {
  provider = google-beta
  project  = var.pubsub_project
  service  = "pubsub.googleapis.com"
}

# A grant takes up to a few minutes to reach every Google API: the BigQuery
# subscription, which Pub/Sub checks against the agent's roles when it is
# created, waits var.iam_propagation_wait after the agent's grants, once
# (again when the set of grants changes).
resource "time_sleep" "agent_grants" {
  create_duration = var.iam_propagation_wait
  triggers = {
    dataset     = join(",", [for g in google_bigquery_dataset_iam_member.pubsub_agent : g.id])
    dead_letter = google_pubsub_topic_iam_member.dead_letter_publisher.id
  }
}

resource "google_pubsub_topic" "events" {
  labels  = var.labels
  project = var.pubsub_project
  name    = var.topic_id
}

resource "google_pubsub_topic" "dead_letter" {
  labels  = var.labels
  project = var.pubsub_project
  name    = "${var.topic_id}-dead-letter"
}

# Keeps dead letters, so they can be counted and inspected.
resource "google_pubsub_subscription" "dead_letter" {
  labels                     = var.labels
  project                    = var.pubsub_project
  name                       = "${var.topic_id}-dead-letter"
  topic                      = google_pubsub_topic.dead_letter.id
  message_retention_duration = "604800s"
  ack_deadline_seconds       = 60
  expiration_policy {
    ttl = ""
  }
}

resource "google_bigquery_dataset" "internal" {
  labels     = var.labels
  project    = var.bigquery_project
  dataset_id = var.dataset_id
  location   = var.location
}

# The events table: the SDK's REPLICATION_TABLE_SCHEMA (generated from
# event.TableSchema by go generate). Partitioned by ingestion time (the
# schema has no timestamp), so the verifier's lookup, bounded by the
# events' acceptance time, prunes old partitions; clustered on generation
# and event_id, which the lookup filters on.
# The latest-state views, in a dataset of their own: the job's role to
# create and replace views (which includes bigquery.tables.update, and so
# could set a table's expiration) is held here, never on the dataset of the
# events table, the verification evidence. The views dataset is authorized
# on the events dataset, so that whoever may read the views reads them
# without access to the events table.
resource "google_bigquery_dataset" "views" {
  labels     = var.labels
  project    = var.bigquery_project
  dataset_id = var.views_dataset_id
  location   = var.location
  # It holds only the views `job views` made, derived and made again on
  # demand: a destroy takes them with it rather than failing on them.
  delete_contents_on_destroy = true
}

resource "google_bigquery_dataset_access" "views" {
  project    = var.bigquery_project
  dataset_id = google_bigquery_dataset.internal.dataset_id
  dataset {
    dataset {
      project_id = google_bigquery_dataset.views.project
      dataset_id = google_bigquery_dataset.views.dataset_id
    }
    target_types = ["VIEWS"]
  }
}

resource "google_bigquery_table" "events" {
  labels              = var.labels
  project             = var.bigquery_project
  dataset_id          = google_bigquery_dataset.internal.dataset_id
  table_id            = var.table_id
  schema              = file("${path.module}/events_schema.json")
  clustering          = ["generation", "event_id"]
  deletion_protection = var.deletion_protection
  time_partitioning {
    type = "DAY"
  }
}

resource "google_bigquery_dataset_iam_member" "pubsub_agent" {
  for_each   = toset(["roles/bigquery.dataEditor", "roles/bigquery.metadataViewer"])
  project    = var.bigquery_project
  dataset_id = google_bigquery_dataset.internal.dataset_id
  role       = each.value
  member     = local.pubsub_agent
  depends_on = [google_project_service_identity.pubsub]
}

resource "google_pubsub_topic_iam_member" "dead_letter_publisher" {
  project = var.pubsub_project
  topic   = google_pubsub_topic.dead_letter.name
  role    = "roles/pubsub.publisher"
  member  = local.pubsub_agent

  depends_on = [google_project_service_identity.pubsub]
}

resource "google_pubsub_subscription" "bigquery" {
  labels  = var.labels
  project = var.pubsub_project
  name    = "${var.topic_id}-bigquery"
  topic   = google_pubsub_topic.events.id

  bigquery_config {
    table               = "${google_bigquery_table.events.project}.${google_bigquery_table.events.dataset_id}.${google_bigquery_table.events.table_id}"
    use_table_schema    = true
    drop_unknown_fields = true
  }

  dead_letter_policy {
    dead_letter_topic     = google_pubsub_topic.dead_letter.id
    max_delivery_attempts = var.dead_letter_max_delivery_attempts
  }

  expiration_policy {
    ttl = ""
  }

  depends_on = [time_sleep.agent_grants]
}

resource "google_pubsub_subscription_iam_member" "agent_subscriber" {
  project      = var.pubsub_project
  subscription = google_pubsub_subscription.bigquery.name
  role         = "roles/pubsub.subscriber"
  member       = local.pubsub_agent
  depends_on   = [google_project_service_identity.pubsub]
}

resource "google_pubsub_topic_iam_member" "publishers" {
  for_each = var.publishers
  project  = var.pubsub_project
  topic    = google_pubsub_topic.events.name
  role     = "roles/pubsub.publisher"
  member   = each.value
}

resource "google_bigquery_dataset_iam_member" "verifier" {
  project    = var.bigquery_project
  dataset_id = google_bigquery_dataset.internal.dataset_id
  role       = "roles/bigquery.dataViewer"
  member     = var.verifier
}

# The job: reads the events table (`job audit`, and the views it creates
# read it), and creates the views in their own dataset.
resource "google_bigquery_dataset_iam_member" "job_reader" {
  project    = var.bigquery_project
  dataset_id = google_bigquery_dataset.internal.dataset_id
  role       = "roles/bigquery.dataViewer"
  member     = var.job
}

resource "google_bigquery_dataset_iam_member" "job" {
  project    = var.bigquery_project
  dataset_id = google_bigquery_dataset.views.dataset_id
  role       = var.job_role_id
  member     = var.job
}

# `job dead-letter` pulls the dead-letter subscription (and acknowledges what
# --republish sent again).
resource "google_pubsub_subscription_iam_member" "job_dead_letter" {
  project      = var.pubsub_project
  subscription = google_pubsub_subscription.dead_letter.name
  role         = "roles/pubsub.subscriber"
  member       = var.job
}
