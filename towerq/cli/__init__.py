"""The `towerq` command's client side (`login`, `submit`, `jobs`, `show`, `follow`, `logs`,
`cancel`, `share`, `queue`, `sweep`, `usage`, `fair-share`, `gpus`, `data`, `download`,
`tensorboard`): every one a use of `towerq.Client`, nothing of the service. The server and
admin commands (`service.cli`) add these to the one `towerq` parser."""
