package usage

import (
	"time"

	"github.com/warmfleet/warmfleet/schemas"
)

// PeriodStart is the start of the period (day, week from Monday, month;
// UTC) that holds at. The policy's validation admits no other period; one
// would be read as a day, the shortest, so a budget is never stretched.
func PeriodStart(period string, at time.Time) time.Time {
	y, m, d := at.UTC().Date()
	day := time.Date(y, m, d, 0, 0, 0, 0, time.UTC)
	switch period {
	case schemas.BudgetWeek:
		back := (int(day.Weekday()) + 6) % 7 // days since Monday
		return day.AddDate(0, 0, -back)
	case schemas.BudgetMonth:
		return time.Date(y, m, 1, 0, 0, 0, 0, time.UTC)
	}
	return day
}

// PeriodName names the period starting at start, as a Run's wait says it:
// "day 2026-12-07", "week 2026-12-07" (its Monday), "month 2026-12".
func PeriodName(period string, start time.Time) string {
	switch period {
	case schemas.BudgetWeek:
		return "week " + start.Format(time.DateOnly)
	case schemas.BudgetMonth:
		return "month " + start.Format("2006-01")
	}
	return "day " + start.Format(time.DateOnly)
}

// WindowStart is where the ledger starts reading WF_USAGE when it starts
// at now: the start of the oldest period a budget may need (this month,
// or the week's Monday in the month before). It is the same for every
// replica started in one week, so their cost totals agree.
func WindowStart(now time.Time) time.Time {
	month, week := PeriodStart(schemas.BudgetMonth, now), PeriodStart(schemas.BudgetWeek, now)
	if week.Before(month) {
		return week
	}
	return month
}

// dayOf numbers at's UTC calendar day (days since the Unix epoch).
func dayOf(at time.Time) int64 {
	return at.Unix()/86400 - boolInt(at.Unix() < 0 && at.Unix()%86400 != 0)
}

func boolInt(b bool) int64 {
	if b {
		return 1
	}
	return 0
}
