package arm

import (
	"strings"
)

// Node labels the board sets.
const (
	// LabelBoard is the board model without its revision, label-safe:
	// "raspberry-pi-4-model-b", "radxa-rock-pi-4b".
	LabelBoard = "outpost.io/board"
	// LabelBoardRevision is the Raspberry Pi revision code, "c03114".
	LabelBoardRevision = "outpost.io/board-revision"
)

// maxLabelValue is the longest label value Kubernetes accepts.
const maxLabelValue = 63

// Labels returns the node labels the facts give: LabelBoard when the
// model is known, LabelBoardRevision on a Raspberry Pi with a known
// revision code. It returns nil when there are none.
func (f Facts) Labels() map[string]string {
	var l map[string]string
	set := func(k, v string) {
		if v == "" {
			return
		}
		if l == nil {
			l = map[string]string{}
		}
		l[k] = v
	}
	set(LabelBoard, BoardLabel(f.Model))
	if f.PiRevision != nil && validLabelValue(f.PiRevision.Code) {
		set(LabelBoardRevision, f.PiRevision.Code)
	}
	return l
}

// BoardLabel turns a device-tree model into a label value: without a
// trailing " Rev …", lowercase, each run of other characters than letters
// and digits made one "-", at most 63 characters. It returns "" when
// nothing is left.
func BoardLabel(model string) string {
	m := strings.TrimSpace(model)
	if i := strings.LastIndex(m, " Rev "); i > 0 && !strings.Contains(strings.TrimSpace(m[i+len(" Rev "):]), " ") {
		m = m[:i]
	}
	var b strings.Builder
	dash := false
	for _, c := range strings.ToLower(m) {
		if c >= 'a' && c <= 'z' || c >= '0' && c <= '9' {
			if dash && b.Len() > 0 {
				b.WriteByte('-')
			}
			dash = false
			b.WriteRune(c)
			continue
		}
		dash = true
	}
	s := b.String()
	if len(s) > maxLabelValue {
		s = strings.TrimRight(s[:maxLabelValue], "-")
	}
	return s
}

// validLabelValue reports whether s is a non-empty Kubernetes label
// value: at most 63 of [A-Za-z0-9_.-], starting and ending alphanumeric.
func validLabelValue(s string) bool {
	if s == "" || len(s) > maxLabelValue {
		return false
	}
	alnum := func(c byte) bool { return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' }
	for i := 0; i < len(s); i++ {
		if c := s[i]; !alnum(c) && c != '-' && c != '_' && c != '.' {
			return false
		}
	}
	return alnum(s[0]) && alnum(s[len(s)-1])
}
