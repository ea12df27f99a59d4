"""Where a job's definition folder comes from: a folder under JOB_ROOT, or an s3:// prefix
downloaded into the data folder before submit."""

from __future__ import annotations

import re
import shutil
import uuid
from pathlib import Path, PurePosixPath

from app.errors import DriverTransientError, InvalidRequest
from app.settings import Settings
from app.usecases.services import job_folder


def materialize(settings: Settings, definition: str, job_id: uuid.UUID) -> Path:
    """A local folder holding the job definition, ready for NVFLARE's submit."""
    if not definition.startswith("s3://"):
        folder = job_folder(settings, definition)
        if not folder.is_dir():
            raise InvalidRequest(f"job folder {definition!r} disappeared from the job root")
        return folder
    return _download_s3(settings, definition, job_id)


def _download_s3(settings: Settings, uri: str, job_id: uuid.UUID) -> Path:
    import boto3
    from botocore.exceptions import BotoCoreError, ClientError

    bucket, _, prefix = uri.removeprefix("s3://").partition("/")
    prefix = prefix.rstrip("/")
    name = PurePosixPath(prefix).name
    if not re.fullmatch(r"[A-Za-z0-9._-]+", name):
        raise InvalidRequest(f"{uri}: the last path part must be a valid NVFLARE job name")
    target = settings.data_dir.resolve() / "job-cache" / str(job_id) / name
    if target.is_dir():
        return target  # a retry of the same step: already downloaded
    staging = target.with_name(name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    try:
        s3 = boto3.client("s3")
        paginator = s3.get_paginator("list_objects_v2")
        count = 0
        for page in paginator.paginate(Bucket=bucket, Prefix=prefix + "/"):
            for item in page.get("Contents", []):
                relative = PurePosixPath(item["Key"]).relative_to(prefix)
                if ".." in relative.parts:
                    continue
                dest = staging / relative
                dest.parent.mkdir(parents=True, exist_ok=True)
                s3.download_file(bucket, item["Key"], str(dest))
                count += 1
    except ClientError as exc:
        raise InvalidRequest(f"{uri}: {exc.response.get('Error', {}).get('Code')}") from exc
    except BotoCoreError as exc:
        raise DriverTransientError(f"{uri}: {type(exc).__name__}") from exc
    if count == 0:
        raise InvalidRequest(f"{uri}: no objects under this prefix")
    staging.rename(target)  # atomic: a half-downloaded folder is never submitted
    return target
