// Package usage owns what Runs cost: an attempt's price per hour from its
// node (a rental's price, or the policy's owned rate per GPU model), the
// ended attempts' records on WF_USAGE, their sums per tenant, GPU model
// and period (the ledger budgets and `warmfleet usage` read), each
// tenant's budget state, and the Prometheus figures of both.
package usage
