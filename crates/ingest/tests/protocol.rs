//! Property tests of the wire format and the conversation rules: every frame round-trips, any
//! bytes decode to a frame or a typed error within the limits (never a panic, never a read
//! past them), a stream cut anywhere decodes the same, and the session accepts exactly the
//! conversations `docs/ingest-protocol.md` §3 allows.

use kura_ingest::frame::{self, decode, Frame, FrameHeader, Hello, Limits, Welcome, HEADER_LEN};
use kura_ingest::session::{Session, SessionError, Stage, Step};
use proptest::prelude::*;

fn arb_frame() -> impl Strategy<Value = Frame> {
    prop_oneof![
        (
            any::<u16>(),
            any::<u16>(),
            any::<u8>(),
            0u8..2,
            any::<[u8; 16]>()
        )
            .prop_map(
                |(min_version, max_version, stage, ack, client_nonce)| Frame::Hello(Hello {
                    min_version,
                    max_version,
                    stage,
                    ack,
                    client_nonce
                })
            ),
        (
            any::<u16>(),
            0u8..2,
            any::<u32>(),
            any::<u64>(),
            any::<[u8; 16]>()
        )
            .prop_map(|(version, auth, max_frame, max_record, server_nonce)| {
                Frame::Welcome(Welcome {
                    version,
                    auth,
                    max_frame,
                    max_record,
                    server_nonce,
                })
            }),
        any::<[u8; 32]>().prop_map(|mac| Frame::Auth { mac }),
        Just(Frame::Ready),
        (any::<u64>(), any::<u64>()).prop_map(|(seq, size)| Frame::Begin { seq, size }),
        proptest::collection::vec(any::<u8>(), 1..2000).prop_map(Frame::Data),
        (any::<u32>(), any::<bool>()).prop_map(|(record_crc, ack)| Frame::End { record_crc, ack }),
        any::<u64>().prop_map(|upto| Frame::Sync { upto }),
        Just(Frame::Bye),
        (any::<u64>(), any::<u64>()).prop_map(|(seq, id)| Frame::Ack { seq, id }),
        (any::<u64>(), any::<u64>()).prop_map(|(upto, records)| Frame::Synced { upto, records }),
        (any::<u16>(), any::<u64>(), "[a-z é]{0,80}")
            .prop_map(|(code, seq, message)| Frame::Error { code, seq, message }),
    ]
}

fn limits() -> Limits {
    Limits {
        max_frame: 4096,
        max_record: 1 << 20,
    }
}

proptest! {
    #[test]
    fn every_frame_round_trips(f in arb_frame()) {
        let bytes = f.encode();
        let (back, used) = decode(&bytes, &limits()).expect("valid").expect("complete");
        prop_assert_eq!(used, bytes.len());
        prop_assert_eq!(back, f);
    }

    #[test]
    fn any_bytes_give_a_frame_or_a_typed_error_within_the_limits(
        bytes in proptest::collection::vec(any::<u8>(), 0..300),
        max_frame in 1u32..200,
    ) {
        let l = Limits { max_frame, max_record: 1000 };
        if let Ok(Some((_, used))) = decode(&bytes, &l) {
            prop_assert!(used <= HEADER_LEN + max_frame as usize);
        }
        // A header alone is judged without its payload.
        if let Some(h) = bytes.get(..HEADER_LEN) {
            let mut hb = [0u8; HEADER_LEN];
            hb.copy_from_slice(h);
            if let Ok(h) = FrameHeader::parse(&hb, &l) {
                prop_assert!(h.len <= max_frame.max(268));
            }
        }
    }

    #[test]
    fn a_flipped_bit_anywhere_is_never_accepted_as_the_same_frame(
        f in arb_frame(), pick in any::<prop::sample::Index>(), bit in 0u8..8,
    ) {
        let mut bytes = f.encode();
        let at = pick.index(bytes.len());
        bytes[at] ^= 1 << bit;
        // CRC32C catches every single-bit error; a flip in the length may instead ask for
        // more bytes, never yield a frame.
        let got = decode(&bytes, &limits());
        prop_assert!(!matches!(got, Ok(Some(_))), "flip at {} accepted", at);
        if at >= 4 {
            prop_assert!(got.is_err());
        }
    }

    #[test]
    fn a_stream_cut_into_any_pieces_decodes_to_the_same_frames(
        frames in proptest::collection::vec(arb_frame(), 1..12),
        cuts in proptest::collection::vec(1usize..64, 1..40),
    ) {
        let stream: Vec<u8> = frames.iter().flat_map(Frame::encode).collect();
        let mut buf = Vec::new();
        let mut got = Vec::new();
        let mut pos = 0;
        let mut cut = cuts.iter().cycle();
        while pos < stream.len() {
            let n = (*cut.next().expect("cycle")).min(stream.len() - pos);
            buf.extend_from_slice(&stream[pos..pos + n]);
            pos += n;
            while let Some((f, used)) = decode(&buf, &limits()).expect("valid stream") {
                got.push(f);
                buf.drain(..used);
            }
        }
        prop_assert!(buf.is_empty());
        prop_assert_eq!(got, frames);
    }
}

/// Runs the session over encoded frames as a server would: header admitted first, then the
/// payload decoded and applied. Returns the steps, or the first error.
fn serve(session: &mut Session, frames: &[Frame]) -> Result<Vec<Step>, SessionError> {
    let mut steps = Vec::new();
    for f in frames {
        let bytes = f.encode();
        let mut hb = [0u8; HEADER_LEN];
        hb.copy_from_slice(&bytes[..HEADER_LEN]);
        let h = FrameHeader::parse(&hb, &limits()).expect("frame fits the limits");
        session.admit(&h)?;
        match f {
            Frame::Data(d) => session.data(d.len() as u32)?,
            other => steps.push(session.control(other)?),
        }
    }
    Ok(steps)
}

fn hello(stage: u8, ack: u8) -> Frame {
    Frame::Hello(Hello {
        min_version: 1,
        max_version: 3,
        stage,
        ack,
        client_nonce: [0; 16],
    })
}

proptest! {
    #[test]
    fn well_formed_conversations_are_accepted(
        records in proptest::collection::vec(
            (proptest::collection::vec(1usize..3000, 1..5), any::<bool>()), 0..8),
        stage in 0u8..4, ack in 0u8..2,
    ) {
        let mut frames = vec![hello(stage, ack)];
        let mut seq = 10u64;
        for (pieces, flag) in &records {
            let size: usize = pieces.iter().sum();
            frames.push(Frame::Begin { seq, size: size as u64 });
            for (i, p) in pieces.iter().enumerate() {
                frames.push(Frame::Data(vec![i as u8; *p]));
            }
            frames.push(Frame::End { record_crc: 0, ack: *flag });
            seq += 3;
        }
        frames.push(Frame::Sync { upto: seq });
        frames.push(Frame::Bye);
        let mut s = Session::new(limits(), false);
        let steps = serve(&mut s, &frames).expect("accepted");
        prop_assert_eq!(steps[0], Step::Hello { stage: Stage::from_byte(stage).expect("stage"), ack_each: ack == 0 });
        let ends: Vec<_> = steps.iter().filter_map(|s| match s {
            Step::End { size, ack, .. } => Some((*size, *ack)),
            _ => None,
        }).collect();
        let want: Vec<_> = records.iter().map(|(p, flag)| (p.iter().sum::<usize>() as u64, *flag || ack == 0)).collect();
        prop_assert_eq!(ends, want);
    }

    #[test]
    fn any_frame_sequence_ends_in_steps_or_a_typed_error(
        frames in proptest::collection::vec(arb_frame(), 0..20), auth in any::<bool>(),
    ) {
        let mut s = Session::new(limits(), auth);
        let _ = serve(&mut s, &frames);
        // Whatever happened, an open record never holds more than it declared.
        if let Some(r) = s.open() {
            prop_assert!(r.received <= r.size);
        }
    }
}

#[test]
fn data_beyond_the_declared_size_is_refused_before_its_payload_is_read() {
    let mut s = Session::new(limits(), false);
    let err = serve(
        &mut s,
        &[
            hello(1, 0),
            Frame::Begin { seq: 1, size: 10 },
            Frame::Data(vec![0; 6]),
            Frame::Data(vec![0; 6]),
        ],
    )
    .expect_err("overrun");
    assert_eq!(
        err,
        SessionError::Overrun {
            seq: 1,
            size: 10,
            received: 6,
            len: 6
        }
    );
}

#[test]
fn order_rules_are_enforced() {
    let cases: Vec<(Vec<Frame>, &str)> = vec![
        (vec![Frame::Begin { seq: 1, size: 1 }], "BEGIN before HELLO"),
        (
            vec![hello(0, 0), Frame::Auth { mac: [0; 32] }],
            "AUTH without authentication",
        ),
        (
            vec![
                hello(0, 0),
                Frame::Begin { seq: 5, size: 1 },
                Frame::Data(vec![1]),
                Frame::End {
                    record_crc: 0,
                    ack: false,
                },
                Frame::Begin { seq: 5, size: 1 },
            ],
            "a repeated seq",
        ),
        (
            vec![
                hello(0, 0),
                Frame::Begin { seq: 1, size: 4 },
                Frame::Data(vec![1]),
                Frame::End {
                    record_crc: 0,
                    ack: false,
                },
            ],
            "END before the record's bytes",
        ),
        (
            vec![
                hello(0, 0),
                Frame::Begin {
                    seq: 1,
                    size: (1 << 20) + 1,
                },
            ],
            "a record above max_record",
        ),
        (vec![hello(9, 0)], "an unknown stage"),
        (
            vec![Frame::Hello(Hello {
                min_version: 2,
                max_version: 2,
                stage: 0,
                ack: 0,
                client_nonce: [0; 16],
            })],
            "only version 2",
        ),
        (
            vec![hello(0, 0), Frame::Begin { seq: 1, size: 4 }, Frame::Bye],
            "BYE inside a record",
        ),
    ];
    for (frames, what) in cases {
        let mut s = Session::new(limits(), false);
        assert!(serve(&mut s, &frames).is_err(), "{what} was accepted");
    }
    let mut s = Session::new(limits(), true);
    let steps = serve(&mut s, &[hello(0, 1), Frame::Auth { mac: [7; 32] }]).expect("auth");
    assert_eq!(steps[1], Step::Auth { mac: [7; 32] });
}

#[test]
fn error_messages_are_cut_at_a_character_boundary() {
    let long = "é".repeat(200);
    let bytes = Frame::Error {
        code: 1,
        seq: frame::NO_SEQ,
        message: long,
    }
    .encode();
    let (f, _) = decode(&bytes, &limits()).expect("valid").expect("whole");
    let Frame::Error { message, .. } = f else {
        panic!("not an error frame: {f:?}");
    };
    assert_eq!(message, "é".repeat(128));
}
