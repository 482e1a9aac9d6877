// Package deploy holds the files operators install (systemd units, NATS
// configuration). Go code that ships one of them embeds it from here, so the
// file in this folder stays the one source of truth.
package deploy

import _ "embed"

// AgentUnit is systemd/warmfleet-agent.service: the node agent's unit.
//
//go:embed systemd/warmfleet-agent.service
var AgentUnit string
