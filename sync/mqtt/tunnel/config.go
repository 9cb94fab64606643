package tunnel

import (
	"context"
	"log/slog"
	"time"

	"github.com/outpost-edge/outpost/internal/clock"
)

// Defaults of Config and DialerConfig.
const (
	defaultWindow      = 256 << 10
	defaultFrameSize   = 32 << 10
	defaultMaxStreams  = 16
	defaultIdleTimeout = 4 * time.Hour
	defaultOpenTimeout = 10 * time.Second
)

// controlTimeout bounds the publishing of frames no caller waits for:
// accepts, refusals and closes.
const controlTimeout = 5 * time.Second

// Config is the node's end's (Listener's) configuration.
type Config struct {
	// Publish sends one frame to the bridge (the caller publishes it with
	// QoS 1 on the node's up topic; it may block until acknowledged). It
	// fails at once when there is no connection.
	Publish func(ctx context.Context, frame []byte) error
	// Clock is where time comes from (nil: the wall clock).
	Clock clock.Clock
	// Log gets debug records of dropped frames and ended streams (nil:
	// discard).
	Log *slog.Logger
	// Window is how many bytes the bridge may send on a stream before the
	// node has read them (default 256 KiB); it bounds each stream's
	// receive buffer.
	Window int
	// FrameSize is the most bytes of data in one frame (default 32 KiB).
	FrameSize int
	// MaxStreams is how many streams may be open at once (default 16,
	// the node's mqtt.maxStreams); more opens are refused.
	MaxStreams int
	// IdleTimeout ends a stream no frame went either way on for that
	// long (default 4 h, kubelet's streaming idle timeout).
	IdleTimeout time.Duration
}

// DialerConfig is the bridge's end's (Dialer's) configuration.
type DialerConfig struct {
	// Publish sends one frame to node (the caller publishes it with QoS 1
	// on node's down topic; it may block until acknowledged). It fails at
	// once when there is no connection.
	Publish func(ctx context.Context, node string, frame []byte) error
	// Clock is where time comes from (nil: the wall clock).
	Clock clock.Clock
	// Log gets debug records of dropped frames and ended streams (nil:
	// discard).
	Log *slog.Logger
	// Window is how many bytes a node may send on a stream before the
	// bridge has read them (default 256 KiB).
	Window int
	// FrameSize is the most bytes of data in one frame (default 32 KiB).
	FrameSize int
	// IdleTimeout ends a stream no frame went either way on for that
	// long (default 4 h).
	IdleTimeout time.Duration
	// OpenTimeout is how long Dial waits for the node to accept a stream
	// (default 10 s).
	OpenTimeout time.Duration
}

// settings are an end's configuration with the defaults filled in.
type settings struct {
	publish     func(ctx context.Context, node string, frame []byte) error
	clk         clock.Clock
	log         *slog.Logger
	window      int
	frameSize   int
	maxStreams  int
	idleTimeout time.Duration
	openTimeout time.Duration
}

func (c Config) settings() settings {
	publish := c.Publish
	return settings{
		publish:     func(ctx context.Context, _ string, frame []byte) error { return publish(ctx, frame) },
		clk:         c.Clock,
		log:         c.Log,
		window:      c.Window,
		frameSize:   c.FrameSize,
		maxStreams:  c.MaxStreams,
		idleTimeout: c.IdleTimeout,
	}.withDefaults()
}

func (c DialerConfig) settings() settings {
	return settings{
		publish:     c.Publish,
		clk:         c.Clock,
		log:         c.Log,
		window:      c.Window,
		frameSize:   c.FrameSize,
		idleTimeout: c.IdleTimeout,
		openTimeout: c.OpenTimeout,
	}.withDefaults()
}

func (s settings) withDefaults() settings {
	if s.clk == nil {
		s.clk = clock.Real{}
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if s.window <= 0 {
		s.window = defaultWindow
	}
	if s.frameSize <= 0 {
		s.frameSize = defaultFrameSize
	}
	if s.maxStreams <= 0 {
		s.maxStreams = defaultMaxStreams
	}
	if s.idleTimeout <= 0 {
		s.idleTimeout = defaultIdleTimeout
	}
	if s.openTimeout <= 0 {
		s.openTimeout = defaultOpenTimeout
	}
	return s
}
