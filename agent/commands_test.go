package agent

import (
	"testing"

	"github.com/warmfleet/warmfleet/schemas"
)

// admit refuses, with a coded receipt, a command that is malformed, for
// another node, or of an older session or generation, and tells a command
// of a newer session apart: this process must stop, not answer it.
func TestAdmit(t *testing.T) {
	enr := schemas.Enrollment{FencingToken: 5, Generation: 2}
	ok := schemas.Command{OperationID: "op-1", NodeID: "n1", FencingToken: 5, Generation: 2, Kind: schemas.CmdReconcile}
	for name, tc := range map[string]struct {
		edit func(*schemas.Command)
		want admission
		code schemas.Code
	}{
		"admitted":       {edit: func(*schemas.Command) {}, want: admitted},
		"malformed":      {edit: func(c *schemas.Command) { c.OperationID = "" }, want: refused, code: schemas.CodeMissingField},
		"another node's": {edit: func(c *schemas.Command) { c.NodeID = "n2" }, want: refused, code: schemas.CodeWrongNode},
		"stale session":  {edit: func(c *schemas.Command) { c.FencingToken = 4 }, want: refused, code: schemas.CodeStaleFencingToken},
		"newer session":  {edit: func(c *schemas.Command) { c.FencingToken = 6 }, want: superseded},
		"old generation": {edit: func(c *schemas.Command) { c.Generation = 1 }, want: refused, code: schemas.CodeStaleGeneration},
	} {
		c := ok
		tc.edit(&c)
		var rc schemas.OperationReceipt
		got := admit(c, "n1", enr, &rc)
		if got != tc.want || rc.Code != tc.code || (got == refused) != (rc.Outcome == schemas.OutcomeRefused && rc.Message != "") {
			t.Errorf("%s: admission %d, receipt %+v; want %d with %q", name, got, rc, tc.want, tc.code)
		}
	}
}
