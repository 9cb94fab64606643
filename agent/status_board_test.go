package agent

import (
	"io"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/outpost-edge/outpost/arm"
	"github.com/outpost-edge/outpost/internal/clock/clocktest"
	"github.com/outpost-edge/outpost/store"
)

// Status shows the board facts read at start with the health read now.
func TestStatusReadsBoardHealthEachTime(t *testing.T) {
	dir := t.TempDir()
	st, err := store.Open(filepath.Join(dir, store.FileName), store.Options{NodeName: "n1"})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	temp := 40000
	a, err := New(Config{NodeName: "n1", ManifestDir: dir, Board: arm.Facts{Model: "Raspberry Pi 5 Model B Rev 1.0", Cgroup: arm.CgroupV2}},
		Deps{Store: st, Clock: clocktest.New(time.Unix(1000, 0)), Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
			BoardHealth: func() arm.Readings { return arm.Readings{Zones: []arm.Zone{{Name: "thermal_zone0", MilliC: temp}}} }})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []int{40000, 81000} {
		temp = want
		s, err := a.Status()
		if err != nil {
			t.Fatal(err)
		}
		b := s.Agent.Board
		if b.Model != "Raspberry Pi 5 Model B Rev 1.0" || len(b.Health.Zones) != 1 || b.Health.Zones[0].MilliC != want {
			t.Fatalf("board %+v, want %d m°C", b, want)
		}
	}
}
