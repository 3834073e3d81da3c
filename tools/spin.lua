-- Wireshark/tshark dissector for the spinnic wire format v1 (docs/wire-format.md), with the
-- collective extension and the authentication tag.
--
--   tshark -X lua_script:tools/spin.lua -r capture.pcap
--   wireshark -X lua_script:tools/spin.lua capture.pcap
--
-- Registered on UDP destination port 17771 (preference "spin.udp_port"). Frames the runtime's
-- parser (wire::parse) rejects at the spin layer get expert info in the "Malformed" group with
-- the parser's reason name: spin_truncated, bad_version, bad_type, bad_flags, length_mismatch,
-- bad_offset. Lower layers (Ethernet, IPv4, UDP) are Wireshark's own dissectors. See
-- tools/README.md for running it as root.

local default_port = 17771
local base_len = 46  -- spin header without extension
local coll_len = 16  -- collective extension
local auth_len = 8   -- authentication tag

local spin = Proto("spin", "spinnic wire format v1")

local type_names = { [1] = "data", [2] = "ack", [3] = "nack", [4] = "result", [5] = "control" }

local FLAG_START, FLAG_END, FLAG_RETRANSMIT, FLAG_COLL, FLAG_AUTH = 0x0001, 0x0002, 0x0004, 0x0008, 0x0010
local KNOWN_FLAGS = 0x001f

local f = spin.fields
f.version = ProtoField.uint8("spin.version", "Version", base.DEC)
f.type = ProtoField.uint8("spin.type", "Type", base.DEC, type_names)
f.flags = ProtoField.uint16("spin.flags", "Flags", base.HEX)
f.flag_start = ProtoField.bool("spin.flags.start", "Start of message", 16, nil, FLAG_START)
f.flag_end = ProtoField.bool("spin.flags.end", "End of message", 16, nil, FLAG_END)
f.flag_retransmit = ProtoField.bool("spin.flags.retransmit", "Retransmission", 16, nil, FLAG_RETRANSMIT)
f.flag_coll = ProtoField.bool("spin.flags.coll", "Collective extension", 16, nil, FLAG_COLL)
f.flag_auth = ProtoField.bool("spin.flags.auth", "Authentication tag", 16, nil, FLAG_AUTH)
f.flag_unknown = ProtoField.uint16("spin.flags.unknown", "Unknown flag bits", base.HEX, nil, 0xffe0)
f.src_rank = ProtoField.uint32("spin.src_rank", "Source rank", base.DEC)
f.match_bits = ProtoField.uint64("spin.match_bits", "Match bits", base.HEX)
f.msg_id = ProtoField.uint64("spin.msg_id", "Message id", base.HEX)
f.seq = ProtoField.uint32("spin.seq", "Sequence number", base.DEC)
f.payload_len = ProtoField.uint16("spin.payload_len", "Payload length", base.DEC)
f.msg_len = ProtoField.uint64("spin.msg_len", "Message length", base.DEC)
f.offset = ProtoField.uint64("spin.offset", "Offset", base.DEC)
f.coll = ProtoField.none("spin.coll", "Collective extension")
f.coll_op = ProtoField.uint8("spin.coll.op", "Operation", base.DEC)
f.coll_dtype = ProtoField.uint8("spin.coll.dtype", "Datatype", base.DEC)
f.coll_slot = ProtoField.uint16("spin.coll.slot", "Slot", base.DEC, nil, 0x7fff)
f.coll_shadow = ProtoField.bool("spin.coll.shadow", "Shadow copy", 16, nil, 0x8000)
f.coll_elem_count = ProtoField.uint32("spin.coll.elem_count", "Element count", base.DEC)
f.coll_epoch = ProtoField.uint32("spin.coll.epoch", "Epoch", base.DEC)
f.coll_aux = ProtoField.uint32("spin.coll.aux", "Aux", base.HEX)
f.auth_tag = ProtoField.uint64("spin.auth_tag", "Authentication tag", base.HEX)

-- Expert info, named after wire::reject reasons.
local MALFORMED, ERROR = expert.group.MALFORMED, expert.severity.ERROR
local e_truncated = ProtoExpert.new("spin.spin_truncated", "Truncated spin header", MALFORMED, ERROR)
local e_version = ProtoExpert.new("spin.bad_version", "Unknown spin version", MALFORMED, ERROR)
local e_type = ProtoExpert.new("spin.bad_type", "Unknown packet type", MALFORMED, ERROR)
local e_flags = ProtoExpert.new("spin.bad_flags", "Invalid flags", MALFORMED, ERROR)
local e_length = ProtoExpert.new("spin.length_mismatch", "Payload length disagrees with the UDP length", MALFORMED, ERROR)
local e_offset = ProtoExpert.new("spin.bad_offset", "Payload does not fit the message", MALFORMED, ERROR)
spin.experts = { e_truncated, e_version, e_type, e_flags, e_length, e_offset }

spin.prefs.udp_port = Pref.uint("UDP port", default_port, "UDP destination port of spin packets")

local data_dissector = Dissector.get("data")

-- Spin header fields in wire order: offset, size, field.
local base_fields = {
  { 0, 1, f.version }, { 1, 1, f.type }, { 2, 2, f.flags }, { 4, 4, f.src_rank },
  { 8, 8, f.match_bits }, { 16, 8, f.msg_id }, { 24, 4, f.seq }, { 28, 2, f.payload_len },
  { 30, 8, f.msg_len }, { 38, 8, f.offset },
}

local function hex(u64)
  local s = u64:tohex():gsub("^0+", "")
  return "0x" .. (s == "" and "0" or s)
end

local function flag_names(flags)
  local names = {}
  if bit.band(flags, FLAG_START) ~= 0 then names[#names + 1] = "start" end
  if bit.band(flags, FLAG_END) ~= 0 then names[#names + 1] = "end" end
  if bit.band(flags, FLAG_RETRANSMIT) ~= 0 then names[#names + 1] = "retransmit" end
  if bit.band(flags, FLAG_COLL) ~= 0 then names[#names + 1] = "coll" end
  if bit.band(flags, FLAG_AUTH) ~= 0 then names[#names + 1] = "auth" end
  if bit.band(flags, bit.bnot(KNOWN_FLAGS), 0xffff) ~= 0 then
    names[#names + 1] = string.format("unknown 0x%04x", bit.band(flags, 0xffe0))
  end
  return table.concat(names, ",")
end

local function add_flags(tree, range)
  local item = tree:add(f.flags, range)
  item:add(f.flag_start, range)
  item:add(f.flag_end, range)
  item:add(f.flag_retransmit, range)
  item:add(f.flag_coll, range)
  item:add(f.flag_auth, range)
  item:add(f.flag_unknown, range)
  return item
end

function spin.dissector(tvb, pinfo, tree)
  -- Only the destination port selects spin (docs/wire-format.md, "UDP port").
  if pinfo.dst_port ~= spin.prefs.udp_port then return 0 end

  pinfo.cols.protocol = "SPIN"
  local len = tvb:len()              -- bytes captured of the UDP payload
  local udp_payload = tvb:reported_len()  -- UDP length - 8, whatever the snapshot kept

  if udp_payload < base_len or len < base_len then
    local item = tree:add(spin, tvb(), "spin")
    for _, fd in ipairs(base_fields) do
      if fd[1] + fd[2] <= len then
        if fd[3] == f.flags then add_flags(item, tvb(fd[1], fd[2])) else item:add(fd[3], tvb(fd[1], fd[2])) end
      end
    end
    item:add_proto_expert_info(e_truncated, string.format("Truncated spin header: %d of %d bytes", udp_payload, base_len))
    pinfo.cols.info:set(string.format("spin [truncated header: %d of %d bytes]", udp_payload, base_len))
    return len
  end

  local version = tvb(0, 1):uint()
  if version ~= 1 then
    local item = tree:add(spin, tvb(), "spin, unknown version " .. version)
    item:add(f.version, tvb(0, 1)):add_proto_expert_info(e_version, "Unknown spin version " .. version .. " (expected 1)")
    pinfo.cols.info:set("spin [unknown version " .. version .. "]")
    data_dissector:call(tvb(1):tvb(), pinfo, tree)
    return len
  end

  local ptype = tvb(1, 1):uint()
  local flags = tvb(2, 2):uint()
  local src = tvb(4, 4):uint()
  local msg_id = tvb(16, 8):uint64()
  local seq = tvb(24, 4):uint()
  local payload_len = tvb(28, 2):uint()
  local msg_len = tvb(30, 8):uint64()
  local offset = tvb(38, 8):uint64()
  local has_coll = bit.band(flags, FLAG_COLL) ~= 0
  local has_auth = bit.band(flags, FLAG_AUTH) ~= 0
  local hdr_len = base_len + (has_coll and coll_len or 0) + (has_auth and auth_len or 0)
  local tname = type_names[ptype] or ("unknown(" .. ptype .. ")")

  local info = string.format("spin %s seq=%u src=%u msg=%s len=%u", tname, seq, src, hex(msg_id), payload_len)
  local problems = {}
  local item = tree:add(spin, tvb(0, math.min(hdr_len, len)), "spin, " .. info:sub(6))

  for _, fd in ipairs(base_fields) do
    local range = tvb(fd[1], fd[2])
    local sub
    if fd[3] == f.flags then sub = add_flags(item, range) else sub = item:add(fd[3], range) end
    if fd[3] == f.type and type_names[ptype] == nil then
      sub:add_proto_expert_info(e_type, "Unknown packet type " .. ptype)
      problems[#problems + 1] = "unknown type"
    elseif fd[3] == f.flags then
      if bit.band(flags, bit.bnot(KNOWN_FLAGS), 0xffff) ~= 0 then
        sub:add_proto_expert_info(e_flags, string.format("Unknown flag bits 0x%04x", bit.band(flags, 0xffe0)))
        problems[#problems + 1] = "unknown flags"
      end
      if bit.band(flags, FLAG_START) ~= 0 and tvb(24, 4):uint() ~= 0 then
        sub:add_proto_expert_info(e_flags, "Start flag on a packet with seq " .. tvb(24, 4):uint())
        problems[#problems + 1] = "start flag with seq != 0"
      end
    end
  end

  local ext_truncated = false
  if has_coll or has_auth then
    if udp_payload < hdr_len or len < hdr_len then
      ext_truncated = true
      item:add_proto_expert_info(e_truncated, string.format("Truncated %s: %d of %d bytes",
                                                            has_coll and "collective extension" or "authentication tag",
                                                            udp_payload - base_len, hdr_len - base_len))
      problems[#problems + 1] = "truncated extension"
      hdr_len = math.min(len, hdr_len)
    elseif has_coll then
      local c = tvb(base_len, coll_len)
      local ci = item:add(f.coll, c)
      ci:add(f.coll_op, c(0, 1))
      ci:add(f.coll_dtype, c(1, 1))
      ci:add(f.coll_slot, c(2, 2))
      ci:add(f.coll_shadow, c(2, 2))
      ci:add(f.coll_elem_count, c(4, 4))
      ci:add(f.coll_epoch, c(8, 4))
      ci:add(f.coll_aux, c(12, 4))
      local slot = c(2, 2):uint()
      info = info .. string.format(" op=%u dtype=%u slot=%u%s epoch=%u", c(0, 1):uint(), c(1, 1):uint(),
                                   bit.band(slot, 0x7fff), bit.band(slot, 0x8000) ~= 0 and " shadow" or "",
                                   c(8, 4):uint())
    end
    if has_auth and not ext_truncated then
      local t = tvb(base_len + (has_coll and coll_len or 0), auth_len)
      item:add(f.auth_tag, t)
      info = info .. " tag=" .. hex(t:uint64())
    end
  end

  local carried = udp_payload - hdr_len
  if not ext_truncated then
    if payload_len ~= carried then
      item:add_proto_expert_info(e_length, string.format("Payload length %u disagrees with the %d payload bytes of the UDP datagram",
                                                         payload_len, carried))
      problems[#problems + 1] = "length mismatch"
    end
  end
  local plen = UInt64.new(payload_len)
  if offset > msg_len or plen > msg_len - offset then
    item:add_proto_expert_info(e_offset, string.format("Offset %s + payload length %u exceeds message length %s",
                                                       tostring(offset), payload_len, tostring(msg_len)))
    problems[#problems + 1] = "bad offset"
  elseif bit.band(flags, FLAG_END) ~= 0 and offset + plen ~= msg_len then
    item:add_proto_expert_info(e_offset, string.format("End packet ends at %s, message length is %s",
                                                       tostring(offset + plen), tostring(msg_len)))
    problems[#problems + 1] = "end packet does not end the message"
  end

  local fl = flag_names(flags)
  if fl ~= "" then info = info .. " [" .. fl .. "]" end
  if #problems > 0 then info = info .. " [Malformed: " .. table.concat(problems, ", ") .. "]" end
  pinfo.cols.info:set(info)

  if len > hdr_len then data_dissector:call(tvb(hdr_len):tvb(), pinfo, tree) end
  return len
end

local registered_port = default_port
DissectorTable.get("udp.port"):add(registered_port, spin)

function spin.prefs_changed()
  if spin.prefs.udp_port ~= registered_port then
    DissectorTable.get("udp.port"):remove(registered_port, spin)
    registered_port = spin.prefs.udp_port
    DissectorTable.get("udp.port"):add(registered_port, spin)
  end
end
