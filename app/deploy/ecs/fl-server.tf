# One net's fl-server as an ECS service the dispatcher scales between 0 and 1 task (its ECS
# driver calls DescribeServices and UpdateService(desiredCount) only). A module: one instance
# per net. Checked by `terraform validate` against the AWS provider's schema
# (tests/unit/test_deploy_ecs.py); the container definitions, in
# fl-server-containers.json.tftpl beside it, by botocore's RegisterTaskDefinition schema.
# app/deploy/README.md "The ECS fl-server service" says what each part is for.

terraform {
  required_version = ">= 1.5"
  required_providers {
    aws = {
      source  = "hashicorp/aws"
      version = ">= 5.0"
    }
  }
}

variable "net" {
  description = "The net's name, as the nets file declares it (net-1)"
  type        = string
}

variable "cluster_arn" {
  description = "The ECS cluster the fl-server runs in (the nets entry's driver.cluster)"
  type        = string
}

variable "image" {
  description = "The fl-dispatcher image (it runs `fl-dispatcher participant /workspace`)"
  type        = string
}

variable "server_port" {
  description = "The port the kits name: FL and admin traffic share it (NVFLARE 2.9)"
  type        = number
  default     = 8002
}

variable "subnet_ids" {
  description = "Private subnets of the task"
  type        = list(string)
}

variable "security_group_ids" {
  description = "Security groups letting the sites and the dispatcher's workers reach server_port"
  type        = list(string)
}

variable "namespace_id" {
  description = "The Cloud Map private DNS namespace (e.g. flip.internal) the sites and admins resolve"
  type        = string
}

variable "kit_file_system_id" {
  description = "The EFS file system holding the server's startup kit and job store"
  type        = string
}

variable "kit_access_point_id" {
  description = "The EFS access point of this net's server folder (uid 10001, the image's user)"
  type        = string
}

variable "execution_role_arn" {
  description = "The task execution role (pull the image, write the logs)"
  type        = string
}

variable "task_role_arn" {
  description = "The fl-server's own role (e.g. FLIP's results upload to S3)"
  type        = string
}

variable "log_group" {
  description = "The CloudWatch log group of the fl-server's logs"
  type        = string
}

variable "region" {
  description = "The region of the cluster (the nets entry's driver.region)"
  type        = string
}

# The name sites and admin kits dial: fl-server.<net>.<namespace> resolves to whichever task
# runs now, so sites reconnect to a server that scaled to zero and came back on a new IP.
resource "aws_service_discovery_service" "fl_server" {
  name = "fl-server.${var.net}"

  dns_config {
    namespace_id   = var.namespace_id
    routing_policy = "MULTIVALUE"
    dns_records {
      type = "A"
      ttl  = 10
    }
  }

  health_check_custom_config {
    failure_threshold = 1
  }
}

resource "aws_ecs_task_definition" "fl_server" {
  family                   = "fl-server-${var.net}"
  requires_compatibilities = ["FARGATE"]
  network_mode             = "awsvpc"
  cpu                      = 1024
  memory                   = 4096
  execution_role_arn       = var.execution_role_arn
  task_role_arn            = var.task_role_arn

  container_definitions = templatefile("${path.module}/fl-server-containers.json.tftpl", {
    image       = var.image
    server_port = var.server_port
    log_group   = var.log_group
    region      = var.region
    net         = var.net
  })

  volume {
    name = "kit"
    efs_volume_configuration {
      file_system_id     = var.kit_file_system_id
      transit_encryption = "ENABLED"
      authorization_config {
        access_point_id = var.kit_access_point_id
        iam             = "ENABLED"
      }
    }
  }
}

resource "aws_ecs_service" "fl_server" {
  name            = "fl-server-${var.net}"
  cluster         = var.cluster_arn
  task_definition = aws_ecs_task_definition.fl_server.arn
  launch_type     = "FARGATE"
  # Scaled to zero at start: the dispatcher asks for one task when a job needs the server.
  desired_count = 0
  # One task at most, never two: a deployment stops the old task before starting the new.
  deployment_minimum_healthy_percent = 0
  deployment_maximum_percent         = 100

  network_configuration {
    subnets          = var.subnet_ids
    security_groups  = var.security_group_ids
    assign_public_ip = false
  }

  service_registries {
    registry_arn = aws_service_discovery_service.fl_server.arn
  }

  lifecycle {
    # The dispatcher owns desired_count from here on: an apply must not scale a running
    # server to zero under its job (or start one nobody asked for).
    ignore_changes = [desired_count]
  }
}

output "service_name" {
  description = "The nets entry's driver.service"
  value       = aws_ecs_service.fl_server.name
}

output "server_endpoint" {
  description = "The nets entry's server_endpoint: the host:port the kits must name"
  value       = "fl-server.${var.net}.<namespace name>:${var.server_port}"
}
