# The workspace registry, one per component with only what that component
# needs: its own IAM database user on every workspace database; the
# identity section and each workspace's organisation and runtime subject for
# the drain only. Each is a Secret Manager secret, mounted into the
# component as a file (REPLICATION_WORKSPACES_FILE): Cloud Run allows 32 KB
# for all of a container's variables, about 75 workspaces' worth.
locals {
  registry_path = "/etc/replication/registry.json"

  registry = {
    for c in local.components : c => jsonencode(merge(
      c == "drain" ? { identity = { for k, v in var.identity : k => v if v != null } } : {},
      {
        workspaces = [for id, ws in var.workspaces : merge(
          c == "drain" ? { organization_id = ws.organization_id, runtime_subject = ws.runtime_subject } : {},
          {
            id = id
            database = {
              instance   = ws.database.instance
              name       = ws.database.name
              user       = local.db_users[c]
              iam_auth   = true
              private_ip = ws.database.private_ip
              max_conns  = local.pool_size[c]
            }
            pubsub   = { project = local.workspaces[id].pubsub_project, topic = local.workspaces[id].topic }
            bigquery = { project = local.workspaces[id].bigquery_project, dataset = ws.dataset, table = ws.table, location = ws.bigquery_location, views_dataset = ws.views_dataset }
          }
        )]
      }
    ))
  }
}

resource "google_secret_manager_secret" "registry" {
  for_each  = local.components
  project   = var.project
  secret_id = "replication-registry-${each.key}"
  labels    = var.labels
  replication {
    auto {}
  }
  depends_on = [google_project_service.enabled]
}

# A new version whenever the registry changes; the services mount that
# version, so an apply that changes it rolls out a new revision.
resource "google_secret_manager_secret_version" "registry" {
  for_each    = local.components
  secret      = google_secret_manager_secret.registry[each.key].id
  secret_data = local.registry[each.key]
}

# Each component reads its own registry only.
resource "google_secret_manager_secret_iam_member" "registry" {
  for_each  = local.components
  project   = var.project
  secret_id = google_secret_manager_secret.registry[each.key].secret_id
  role      = "roles/secretmanager.secretAccessor"
  member    = "serviceAccount:${google_service_account.component[each.key].email}"
}
