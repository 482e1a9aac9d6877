package shadeform

import (
	"strconv"
	"strings"

	"github.com/warmfleet/warmfleet/adapters/capacity"
)

// Tags carry what Shadeform cannot: who owns an instance, for which rental
// and generation, and which provision created it. They are "key=value"
// strings, Shadeform's only free-form, listable instance metadata.
const (
	tagOwner      = "wf-owner"
	tagRental     = "wf-rental"
	tagGeneration = "wf-generation"
	tagOperation  = "wf-operation"
	tagConnection = "wf-connection"
)

// instanceName is wf-<rental>-g<generation>: readable in Shadeform's
// console. It is never trusted for ownership; the owner tag is.
func instanceName(rental string, generation uint64) string {
	return "wf-" + rental + "-g" + strconv.FormatUint(generation, 10)
}

func tagsFor(cmd capacity.ProvisionCommand) []string {
	tags := []string{
		tagOwner + "=" + cmd.OwnershipToken,
		tagRental + "=" + cmd.RentalID,
		tagGeneration + "=" + strconv.FormatUint(cmd.Generation, 10),
		tagOperation + "=" + cmd.OperationKey,
	}
	if cmd.ConnectionID != "" {
		tags = append(tags, tagConnection+"="+cmd.ConnectionID)
	}
	return tags
}

// marks is what our tags say about an instance.
type marks struct {
	owners     []string
	rental     string
	generation uint64
	operation  string
}

func marksOf(tags []string) marks {
	var m marks
	for _, t := range tags {
		k, v, ok := strings.Cut(t, "=")
		if !ok {
			continue
		}
		switch k {
		case tagOwner:
			m.owners = append(m.owners, v)
		case tagRental:
			m.rental = v
		case tagGeneration:
			m.generation, _ = strconv.ParseUint(v, 10, 64)
		case tagOperation:
			m.operation = v
		}
	}
	return m
}

// ownedBy reports whether the instance carries token as its one owner. An
// instance with no owner tag, another owner, or conflicting owner tags is
// not ours, whatever its name says.
func (m marks) ownedBy(token string) bool {
	if token == "" || len(m.owners) == 0 {
		return false
	}
	for _, o := range m.owners {
		if o != token {
			return false
		}
	}
	return true
}
