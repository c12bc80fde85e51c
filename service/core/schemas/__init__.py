"""Pydantic schemas of what the API returns, one module per area (`jobs`, `sweeps`, `lab`,
`usage`, `files`): the API's routes, the domains that build answers (`service.jobs.read`,
`service.lab.accounting`) and the OpenAPI document read them from here. Request bodies stay
beside their routes. The job spec users submit is the contract in `towerq.contract.spec`
(`JobSpec`), shared with the trainer."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Out(BaseModel):
    """A schema read from ORM rows (`Out.model_validate(row)`), or built by field name."""

    model_config = ConfigDict(from_attributes=True, validate_by_name=True, validate_by_alias=True)
