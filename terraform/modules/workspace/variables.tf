variable "workspace_id" {
  description = "Workspace id, used in resource names."
  type        = string
}

variable "pubsub_project" {
  description = "Project of the workspace's topics and subscriptions."
  type        = string
}

variable "topic_id" {
  description = "Id of the events topic."
  type        = string
}

variable "bigquery_project" {
  description = "Project of the workspace's dataset."
  type        = string
}

variable "dataset_id" {
  description = "Dataset of the events table (the SDK's views expect ontology_internal)."
  type        = string
}

variable "views_dataset_id" {
  description = "Dataset of the latest-state views `job views` creates (not the events table's: the job's role to create views is held there only)."
  type        = string
}

variable "table_id" {
  description = "Events table id."
  type        = string
}

variable "location" {
  description = "BigQuery dataset location."
  type        = string
}

variable "dead_letter_max_delivery_attempts" {
  description = "Delivery attempts before a message is dead-lettered."
  type        = number
}

variable "publishers" {
  description = "Members allowed to publish to the events topic (the drain, the verifier's sweep, the job), by component name: the keys are known at plan."
  type        = map(string)
}

variable "verifier" {
  description = "The verifier's member: reads the dataset."
  type        = string
}

variable "job" {
  description = "The job's member: creates the views in the dataset."
  type        = string
}

variable "job_role_id" {
  description = "The custom role the job gets on the dataset: create and replace views, read table metadata (projects/<bigquery project>/roles/replicationViews)."
  type        = string
}

variable "deletion_protection" {
  description = "Whether terraform refuses to delete the events table (the verification evidence)."
  type        = bool
  default     = true
}

variable "labels" {
  description = "Labels put on the workspace's topics, subscriptions, datasets and table."
  type        = map(string)
  default     = {}
}

variable "iam_propagation_wait" {
  description = "How long the BigQuery subscription's creation waits after the Pub/Sub agent's grants (a duration such as 60s)."
  type        = string
  default     = "60s"
}
