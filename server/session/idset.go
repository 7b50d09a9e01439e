package session

import "sort"

// idRangesMax bounds the disjoint runs of consumer ids one session may
// have used. A client numbering its consumers upwards (as the Go client
// does) uses one run however many it subscribes and cancels; one that
// scatters its ids past this many runs is refused new ones
// (resource-limit), instead of the server keeping a record per id used
// for as long as the session lasts.
const idRangesMax = 4096

// idSet is the set of consumer ids a session has used (ids are never
// reused in a session, PROTOCOL.md 6.1), kept as sorted, disjoint,
// non-adjacent runs [first, last].
type idSet struct {
	runs []idRun
}

type idRun struct{ first, last uint32 }

// find is the index of the first run whose last is at least id.
func (s *idSet) find(id uint32) int {
	return sort.Search(len(s.runs), func(i int) bool { return s.runs[i].last >= id })
}

func (s *idSet) has(id uint32) bool {
	i := s.find(id)
	return i < len(s.runs) && s.runs[i].first <= id
}

// joins reports, for id not in the set, where it goes: at index i, and
// whether it extends the run before (ending at id-1) and the one at i
// (starting at id+1).
func (s *idSet) joins(id uint32) (i int, prev, next bool) {
	i = s.find(id)
	prev = i > 0 && s.runs[i-1].last+1 == id
	next = i < len(s.runs) && id < s.runs[i].first && s.runs[i].first-1 == id
	return i, prev, next
}

// canAdd reports whether add(id) would succeed, for id not in the set.
func (s *idSet) canAdd(id uint32) bool {
	_, prev, next := s.joins(id)
	return prev || next || len(s.runs) < idRangesMax
}

// add records id, which must not be in the set. It reports false, and
// records nothing, if id would start a run past idRangesMax.
func (s *idSet) add(id uint32) bool {
	i, joinPrev, joinNext := s.joins(id)
	switch {
	case joinPrev && joinNext:
		s.runs[i-1].last = s.runs[i].last
		s.runs = append(s.runs[:i], s.runs[i+1:]...)
	case joinPrev:
		s.runs[i-1].last = id
	case joinNext:
		s.runs[i].first = id
	default:
		if len(s.runs) >= idRangesMax {
			return false
		}
		s.runs = append(s.runs, idRun{})
		copy(s.runs[i+1:], s.runs[i:])
		s.runs[i] = idRun{id, id}
	}
	return true
}
