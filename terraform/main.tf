data "google_project" "this" {
  project_id = var.project
}

locals {
  # The verifier's deterministic URL (Cloud Run's
  # https://<service>-<project number>.<region>.run.app): the audience of the
  # scheduler's token, which the verifier checks, known before the service
  # exists (its own uri would make the service depend on itself).
  verify_url = "https://replication-verify-${data.google_project.this.number}.${var.region}.run.app"

  components = toset(["drain", "verify", "job"])

  # The services and the job exist once the first build has pushed the
  # images (see terraform/README.md: the first apply creates what the build
  # needs).
  deploy = var.functions_image != "" && var.job_image != ""

  # The IAM database user of a service account is its email without
  # ".gserviceaccount.com".
  db_users = { for c in local.components : c => trimsuffix(google_service_account.component[c].email, ".gserviceaccount.com") }

  # Each workspace with its defaults resolved, and the projects its
  # resources live in.
  workspaces = {
    for id, ws in var.workspaces : id => {
      pubsub_project   = coalesce(ws.pubsub_project, var.project)
      bigquery_project = coalesce(ws.bigquery_project, var.project)
      topic            = coalesce(ws.topic, "ontology-replication-${id}")
      sql_project      = split(":", ws.database.instance)[0]
      sql_instance     = split(":", ws.database.instance)[2]
    }
  }

  # The Cloud SQL instances and BigQuery projects the workspaces use, by
  # name from the configuration (never from a computed value).
  sql_instances     = { for id, ws in var.workspaces : ws.database.instance => { project = local.workspaces[id].sql_project, name = local.workspaces[id].sql_instance }... }
  sql_instance      = { for k, v in local.sql_instances : k => v[0] }
  bigquery_projects = toset([for id, ws in local.workspaces : ws.bigquery_project])

  # The worst case of connections on one workspace database.
  worst_case_connections = var.drain_max_instances * var.drain_pool_size + var.verifier_pool_size + var.job_tasks * var.job_pool_size
  pool_size              = { drain = var.drain_pool_size, verify = var.verifier_pool_size, job = var.job_pool_size }

  # The worst case of connections on one Cloud SQL instance, whose
  # max_connections all its workspace databases share: each process (a drain
  # instance, the verifier's one instance, a job task) holds at most its pool
  # size per workspace database there, and at most its per-server cap
  # (DATABASE_SERVER_MAX_CONNS) however many databases the instance holds.
  server_max_conns = { drain = var.drain_server_max_connections, verify = var.verifier_server_max_connections, job = var.job_server_max_connections }
  instance_connections = {
    for instance, members in local.sql_instances : instance => (
      var.drain_max_instances * min(var.drain_server_max_connections, var.drain_pool_size * length(members))
      + 1 * min(var.verifier_server_max_connections, var.verifier_pool_size * length(members))
      + var.job_tasks * min(var.job_server_max_connections, var.job_pool_size * length(members))
    )
  }
  instance_budget = {
    for instance, _ in local.sql_instances : instance => lookup(var.sql_instance_max_connections, instance, var.default_sql_max_connections) - var.sdk_reserved_connections
  }
  instances_over_budget = [
    for instance, n in local.instance_connections : "${instance}: ${n} > ${local.instance_budget[instance]}" if n > local.instance_budget[instance]
  ]

  vpc = var.vpc_network == "" ? [] : [1]
}

resource "google_service_account" "component" {
  for_each     = local.components
  project      = var.project
  account_id   = "replication-${each.key}"
  display_name = "Ontology replication ${each.key}"
  depends_on   = [google_project_service.enabled]
}

resource "google_service_account" "scheduler" {
  project      = var.project
  account_id   = "replication-scheduler"
  display_name = "Ontology replication verifier schedule"
  depends_on   = [google_project_service.enabled]
}

module "workspace" {
  source   = "./modules/workspace"
  for_each = var.workspaces

  workspace_id                      = each.key
  pubsub_project                    = local.workspaces[each.key].pubsub_project
  topic_id                          = local.workspaces[each.key].topic
  bigquery_project                  = local.workspaces[each.key].bigquery_project
  dataset_id                        = each.value.dataset
  table_id                          = each.value.table
  views_dataset_id                  = each.value.views_dataset
  location                          = each.value.bigquery_location
  dead_letter_max_delivery_attempts = var.dead_letter_max_delivery_attempts
  deletion_protection               = var.events_table_deletion_protection
  labels                            = var.labels
  iam_propagation_wait              = var.iam_propagation_wait
  # Keyed by component: the keys are known at plan, whatever the emails.
  publishers  = { for c in local.components : c => "serviceAccount:${google_service_account.component[c].email}" }
  verifier    = "serviceAccount:${google_service_account.component["verify"].email}"
  job         = "serviceAccount:${google_service_account.component["job"].email}"
  job_role_id = google_project_iam_custom_role.views[local.workspaces[each.key].bigquery_project].id
}

# Cloud SQL: connect (client) and log in with IAM (instanceUser), for every
# component, in the instance's project and only on the workspaces'
# instances (an IAM condition on the instance's name).
resource "google_project_iam_member" "cloudsql" {
  for_each = {
    for t in setproduct(local.components, keys(local.sql_instance), ["roles/cloudsql.client", "roles/cloudsql.instanceUser"]) :
    "${t[0]} ${t[1]} ${t[2]}" => { component = t[0], instance = local.sql_instance[t[1]], role = t[2] }
  }
  project = each.value.instance.project
  role    = each.value.role
  member  = "serviceAccount:${google_service_account.component[each.value.component].email}"
  condition {
    title      = "replication-${each.value.instance.name}"
    expression = "resource.type == \"sqladmin.googleapis.com/Instance\" && resource.name == \"projects/${each.value.instance.project}/instances/${each.value.instance.name}\""
  }
}

# A grant takes up to a few minutes to reach every Google API: the services
# and the job, whose first revision reads its registry secret and logs in to
# Cloud SQL at once, wait var.iam_propagation_wait after those grants, on the
# apply that makes them (again when the set of grants changes).
resource "time_sleep" "grants" {
  create_duration = var.iam_propagation_wait
  triggers = {
    registry = join(",", [for g in google_secret_manager_secret_iam_member.registry : g.id])
    cloudsql = join(",", [for g in google_project_iam_member.cloudsql : g.id])
  }
}

# The Cloud SQL connector's own metrics (dial latency, open connections,
# refresh errors), which it exports to the instance's project: kept on, so
# an operator sees the connections from the database's side, and granted
# here so that the export does not fail (the role writes metrics only).
resource "google_project_iam_member" "connector_metrics" {
  for_each = { for t in setproduct(local.components, toset([for i in local.sql_instance : i.project])) : "${t[0]} ${t[1]}" => { component = t[0], project = t[1] } }
  project  = each.value.project
  role     = "roles/monitoring.metricWriter"
  member   = "serviceAccount:${google_service_account.component[each.value.component].email}"
}

# The components' IAM database users on each instance (the instance needs
# the cloudsql.iam_authentication flag on; the GRANTs are in
# terraform/README.md).
resource "google_sql_user" "component" {
  for_each = {
    for t in setproduct(local.components, keys(local.sql_instance)) : "${t[0]} ${t[1]}" => { component = t[0], instance = local.sql_instance[t[1]] }
  }
  project  = each.value.instance.project
  instance = each.value.instance.name
  name     = local.db_users[each.value.component]
  type     = "CLOUD_IAM_SERVICE_ACCOUNT"
  # PostgreSQL refuses to drop a role that still holds GRANTs (which the
  # operator gave it, outside terraform: README, Database access), so a
  # destroy would stop here; it leaves the users instead, and the README
  # says how to revoke and drop them after.
  deletion_policy = "ABANDON"
}

# BigQuery jobs (the verifier's lookups, the job's view statements) run in
# the project of the workspace's dataset.
resource "google_project_iam_member" "bigquery_jobs" {
  for_each = { for t in setproduct(["verify", "job"], local.bigquery_projects) : "${t[0]} ${t[1]}" => { component = t[0], project = t[1] } }
  project  = each.value.project
  role     = "roles/bigquery.jobUser"
  member   = "serviceAccount:${google_service_account.component[each.value.component].email}"
}

# What `job views` needs on a dataset, and no more: create and replace views
# and read table metadata. bigquery.dataEditor would let it delete the events
# table, the verification evidence.
resource "google_project_iam_custom_role" "views" {
  for_each    = local.bigquery_projects
  project     = each.key
  role_id     = "replicationViews"
  title       = "Ontology replication views"
  description = "Create and replace the replication views in a dataset; read table metadata."
  permissions = ["bigquery.datasets.get", "bigquery.tables.create", "bigquery.tables.get", "bigquery.tables.list", "bigquery.tables.update"]
  depends_on  = [google_project_service.enabled]
}

# Workspaces whose database is reached on its private IP (the default):
# only through Direct VPC egress, so vpc_network must be set.
locals {
  private_ip_workspaces = sort([for id, ws in var.workspaces : id if ws.database.private_ip])
}

resource "terraform_data" "network" {
  input = { private_ip_workspaces = local.private_ip_workspaces, vpc_network = var.vpc_network }
  lifecycle {
    precondition {
      condition     = length(local.private_ip_workspaces) == 0 || var.vpc_network != ""
      error_message = "Workspaces ${join(", ", local.private_ip_workspaces)} reach their Cloud SQL instance on its private IP (database.private_ip, default true), which the services reach only through Direct VPC egress: set vpc_network and vpc_subnetwork (the network the instance's private IP is on), or set database.private_ip = false to connect on its public IP through the connector."
    }
  }
}

# The connection budget (see the variables): refused when it exceeds what
# the SDK's databases can spare.
resource "terraform_data" "connection_budget" {
  input = { database = local.worst_case_connections, instances = local.instance_connections }
  lifecycle {
    precondition {
      condition     = local.worst_case_connections <= var.max_connections_per_database
      error_message = "The worst case of connections on one workspace database, drain_max_instances × drain_pool_size + verifier_pool_size + job_tasks × job_pool_size = ${local.worst_case_connections}, exceeds max_connections_per_database (${var.max_connections_per_database}). Lower the drain's instances or pools, or raise the limit if the database can spare it."
    }
    precondition {
      condition     = length(local.instances_over_budget) == 0
      error_message = "The worst case of connections on a Cloud SQL instance (for each component, its most instances × min(its per-server cap, its pool size × the instance's workspace databases), summed) exceeds the instance's max_connections less sdk_reserved_connections: ${join("; ", local.instances_over_budget)}. Lower drain_max_instances or the *_server_max_connections caps, or declare the instance's real max_connections in sql_instance_max_connections."
    }
  }
}
