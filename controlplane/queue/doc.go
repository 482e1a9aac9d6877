// Package queue owns who runs first, as pure functions over a snapshot of
// the waiting and booked Runs, the fleet and the policy: the order waiting
// Runs are served in (priority class, then weighted dominant-resource
// share among tenants, then age), quotas and cohort borrowing, the victims
// a preempting Run stops, and the rule that re-decides a waiting Run only
// when something it depends on changed. It reads no store and sends no
// message: the scheduler applies what it plans.
package queue
